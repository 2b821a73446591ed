//! From candidates (every occurrence the rules found) to the mentions of a text: occurrences
//! with one canonical form made one entity, aliases folded into the full name they stand for,
//! the list cut to the cap.
//!
//! Alias folding, in this order:
//! - equal canonical forms are one entity, of the strongest kind seen ([`kind_rank`]);
//! - a name of fewer words that is the last word (surname) or a word prefix of exactly one
//!   longer name, first seen after it (or the longer one is the title), is that name:
//!   "Derrickson" and "Scott" after "Scott Derrickson", "New York" after "New York City";
//! - an acronym made of the initials of exactly one multi-word name is that name:
//!   "World Health Organization (WHO)".
//!
//! Every step is a hash lookup per candidate or per word of a name: linear in the text.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

use crate::canonical::{canonical, entity_id, is_han};
use crate::lexicon;
use crate::{EntityKind, Limits, Mention};

/// One occurrence found by a rule.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub canonical: String,
    /// As written, spacing collapsed.
    pub surface: String,
    pub kind: EntityKind,
    pub first_char: u32,
    /// Words of the canonical form.
    pub words: usize,
    /// An acronym that is also a common word ("WHO", "US", "IT"): kept only when it folds
    /// into a name of the text.
    pub weak: bool,
}

/// An entity being gathered: candidates with one canonical form.
struct Entity {
    canonical: String,
    name: String,
    kind: EntityKind,
    count: u32,
    first_char: u32,
    words: usize,
    weak: bool,
    title: bool,
}

/// Which kind an entity keeps when occurrences of several kinds share its canonical form.
fn kind_rank(kind: EntityKind) -> u8 {
    match kind {
        EntityKind::Title => 9,
        EntityKind::Person => 8,
        EntityKind::Organisation => 7,
        EntityKind::Place => 6,
        EntityKind::Proper => 5,
        EntityKind::Name => 4,
        EntityKind::Acronym => 3,
        EntityKind::Date => 2,
        EntityKind::Quantity => 1,
        EntityKind::Quoted => 0,
    }
}

fn is_name_kind(kind: EntityKind) -> bool {
    matches!(
        kind,
        EntityKind::Name
            | EntityKind::Person
            | EntityKind::Place
            | EntityKind::Organisation
            | EntityKind::Proper
    )
}

pub(crate) fn fold(
    candidates: Vec<Candidate>,
    title: Option<&str>,
    limits: &Limits,
) -> Vec<Mention> {
    let mut entities: Vec<Entity> = Vec::new();
    let mut by_canonical: HashMap<String, usize> = HashMap::new();
    if let Some(title) = title.map(str::trim) {
        let name = canonical(title);
        if !name.is_empty() && limits.max_entities > 0 {
            by_canonical.insert(name.clone(), 0);
            entities.push(Entity {
                words: name.split(' ').count(),
                canonical: name,
                name: title.split_whitespace().collect::<Vec<_>>().join(" "),
                kind: EntityKind::Title,
                count: 0,
                first_char: u32::MAX,
                weak: false,
                title: true,
            });
        }
    }
    for candidate in candidates {
        match by_canonical.entry(candidate.canonical) {
            Entry::Occupied(slot) => {
                let entity = &mut entities[*slot.get()];
                entity.count = entity.count.saturating_add(1);
                entity.first_char = entity.first_char.min(candidate.first_char);
                entity.weak &= candidate.weak;
                if kind_rank(candidate.kind) > kind_rank(entity.kind) {
                    entity.kind = candidate.kind;
                }
            }
            Entry::Vacant(slot) => {
                entities.push(Entity {
                    canonical: slot.key().clone(),
                    name: candidate.surface,
                    kind: candidate.kind,
                    count: 1,
                    first_char: candidate.first_char,
                    words: candidate.words,
                    weak: candidate.weak,
                    title: false,
                });
                slot.insert(entities.len() - 1);
            }
        }
    }
    drop(by_canonical);

    let parent = fold_aliases(&entities);
    for index in 0..entities.len() {
        let root = parent[index];
        if root != index {
            let (count, first_char) = (entities[index].count, entities[index].first_char);
            let root = &mut entities[root];
            root.count = root.count.saturating_add(count);
            root.first_char = root.first_char.min(first_char);
        }
    }
    let mut kept: Vec<Entity> = entities
        .into_iter()
        .zip(parent)
        .enumerate()
        .filter(|(index, (entity, root))| index == root && !entity.weak)
        .map(|(_, (entity, _))| entity)
        .collect();

    // the cap: the title, then the most frequent, ties by first occurrence
    let order = |e: &Entity| (Reverse(e.title), Reverse(e.count), e.first_char);
    if kept.len() > limits.max_entities {
        kept.select_nth_unstable_by_key(limits.max_entities, order);
        kept.truncate(limits.max_entities);
    }
    kept.sort_unstable_by_key(order);
    kept.into_iter()
        .map(|entity| Mention {
            id: entity_id(&entity.canonical),
            canonical: entity.canonical,
            name: entity.name,
            kind: entity.kind,
            count: entity.count.max(u32::from(entity.title)),
            first_char: if entity.first_char == u32::MAX {
                0
            } else {
                entity.first_char
            },
        })
        .collect()
}

/// `parent[i]`: the entity that entity `i` is an alias of (itself when none).
fn fold_aliases(entities: &[Entity]) -> Vec<usize> {
    let mut parent: Vec<usize> = (0..entities.len()).collect();
    // keys of the multi-word names: last word, word prefixes (not ending in a connector),
    // initials; `None` where two names share a key
    let mut part_of: HashMap<&str, Option<usize>> = HashMap::new();
    let mut initials_of: HashMap<String, Option<usize>> = HashMap::new();
    for (index, entity) in entities.iter().enumerate() {
        // word parts are an English-name habit: "中国" is no short form of "中国 南京 …"
        if entity.words < 2
            || !(entity.title || is_name_kind(entity.kind))
            || entity.canonical.chars().any(is_han)
        {
            continue;
        }
        let words: Vec<&str> = entity.canonical.split(' ').collect();
        let mut keys: Vec<&str> = vec![words[words.len() - 1]];
        let mut prefix_end = 0;
        for word in &words[..words.len() - 1] {
            prefix_end += word.len();
            if !lexicon::is_connector(word) {
                keys.push(&entity.canonical[..prefix_end]);
            }
            prefix_end += 1;
        }
        for key in keys {
            match part_of.entry(key) {
                Entry::Occupied(mut slot) => {
                    if *slot.get() != Some(index) {
                        slot.insert(None);
                    }
                }
                Entry::Vacant(slot) => {
                    slot.insert(Some(index));
                }
            }
        }
        let all: String = words.iter().filter_map(|w| w.chars().next()).collect();
        let significant: String = words
            .iter()
            .filter(|w| !lexicon::is_connector(w) && !matches!(**w, "and" | "&"))
            .filter_map(|w| w.chars().next())
            .collect();
        for key in [all, significant] {
            if key.chars().count() < 2 {
                continue;
            }
            match initials_of.entry(key) {
                Entry::Occupied(mut slot) => {
                    if *slot.get() != Some(index) {
                        slot.insert(None);
                    }
                }
                Entry::Vacant(slot) => {
                    slot.insert(Some(index));
                }
            }
        }
    }
    // the title's full form with a middle name: "Christopher Edward Nolan" is the document
    // "Christopher Nolan"
    let title_ends = entities
        .iter()
        .position(|e| e.title && e.words >= 2)
        .map(|title| {
            let words: Vec<&str> = entities[title].canonical.split(' ').collect();
            (title, words[0], words[words.len() - 1])
        });
    // longer names first, so that a name folded into a longer one is settled before a
    // shorter name folds into it ("York" -> "New York" -> "New York City")
    let mut order: Vec<usize> = (0..entities.len()).collect();
    order.sort_by_key(|&index| Reverse(entities[index].words));
    for index in order {
        let entity = &entities[index];
        if entity.title {
            continue;
        }
        let middle_name_of_title = title_ends.and_then(|(title, first, last)| {
            let words = &entity.canonical;
            (entity.kind == EntityKind::Name
                && entity.words > entities[title].words
                && words.starts_with(first)
                && words.ends_with(last)
                && words.as_bytes().get(first.len()) == Some(&b' ')
                && words.as_bytes().get(words.len() - last.len() - 1) == Some(&b' '))
            .then_some(title)
        });
        let target = if middle_name_of_title.is_some() {
            middle_name_of_title
        } else if is_name_kind(entity.kind) {
            part_of
                .get(entity.canonical.as_str())
                .copied()
                .flatten()
                .filter(|&target| {
                    let longer = &entities[target];
                    longer.words > entity.words
                        && (longer.title || longer.first_char < entity.first_char)
                })
        } else if entity.kind == EntityKind::Acronym {
            let letters: String = entity
                .canonical
                .chars()
                .filter(|c| c.is_alphabetic())
                .collect();
            initials_of.get(&letters).copied().flatten()
        } else {
            None
        };
        if let Some(target) = target {
            parent[index] = target;
        }
    }
    // a name folds only into a longer name or the title (which folds nowhere), an acronym
    // only into a name: no cycles
    for index in 0..parent.len() {
        let mut root = parent[index];
        while parent[root] != root {
            root = parent[root];
        }
        parent[index] = root;
    }
    parent
}
