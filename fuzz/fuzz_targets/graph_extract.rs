//! The embedded entity extractor (GraphRAG, ADR 0037): `extract` and `query_names` never
//! panic on any text, keep to their caps, and give every entity the id of its canonical name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sift_graph::{Language, Limits, canonical, entity_id, extract, query_names};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the language and a small cap; a NUL splits title from text.
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let (title, text) = match text.split_once('\0') {
        Some((title, text)) => (Some(title), text),
        None => (None, text.as_ref()),
    };
    let language = match choice % 3 {
        0 => Language::English,
        1 => Language::Chinese,
        _ => Language::Auto,
    };
    let limits = Limits {
        max_entities: 1 + usize::from(choice / 3 % 64),
        ..Limits::default()
    };
    let mentions = extract(text, title, language, &limits);
    assert!(mentions.len() <= limits.max_entities, "over the cap");
    for mention in &mentions {
        assert_eq!(mention.id, entity_id(&mention.canonical), "id of another name");
        assert!(mention.count >= 1);
    }
    let names = query_names(text, language);
    assert!(names.len() <= 64, "more than 64 query names");
    for (name, id) in &names {
        assert_eq!(*id, entity_id(name));
    }
    // Folding never panics either (it is not idempotent: a leading article goes once, so
    // "The The" keeps one).
    let _ = canonical(text);
});
