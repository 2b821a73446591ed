//! Tests of `extract` and `query_names`, on real sentences where they exist.
//!
//! Passages quoted from HotpotQA (CC BY-SA 4.0) and CMRC 2018 (CC BY-SA 4.0), both through
//! /work/shared/data (hotpotqa100, cmrc2018-trial).

use std::collections::HashSet;
use std::path::Path;

use proptest::prelude::*;

use super::*;

fn english(text: &str, title: Option<&str>) -> Vec<Mention> {
    extract(text, title, Language::English, &Limits::default())
}

fn find<'m>(mentions: &'m [Mention], canonical: &str) -> Option<&'m Mention> {
    mentions
        .iter()
        .find(|mention| mention.canonical == canonical)
}

fn get<'m>(mentions: &'m [Mention], canonical: &str) -> &'m Mention {
    find(mentions, canonical).unwrap_or_else(|| panic!("no {canonical:?} among {mentions:#?}"))
}

fn canonicals(mentions: &[Mention]) -> HashSet<&str> {
    mentions
        .iter()
        .map(|mention| mention.canonical.as_str())
        .collect()
}

// HotpotQA, "Demon Dice"
const DEMON_DICE: &str = "Demon Dice, originally published as Chaos Progenitus, is a collectible dice game created by Lester Smith (designer of the better-known Dragon Dice) and Tim Brown. In it, each player controls a demon made of 13 dice representing body parts (or magical items wielded by those parts), which battles the other player's demon. The original Chaos Progenitus version presented the concept of these dueling fiends seriously; when the game was republished as Demon Dice by Fast Forward Games (which has since gone out of business), the idea was given a humorous spin, styling the players as \"Demon Creation Specialists, Junior Grade\" in the bureaucracy of Hell.";

// HotpotQA, "Christopher Nolan"
const NOLAN: &str = "Christopher Edward Nolan ( ; born 30 July 1970) is an English-American film director, producer, and screenwriter. He is one of the highest-grossing directors in history, and among the most successful and acclaimed filmmakers of the 21st century.";

// HotpotQA, "Sathish Kalathil"
const KALATHIL: &str = "Sathish Kalathil (മലയാളം: ) is an Indian film and documentary Director and Producer in malayalam. His experimental works are well known and appropriately discussed in Malayalam Cinema industry and his debut movie Jalachhayam (2010) was well discussed according to its experimental approach. In 2012, he directed Laloorinu Parayanullathu, a social committed documentary film about Municipal solid waste.";

// HotpotQA, "Alû"
const ALU: &str = "In Akkadian and Sumerian mythology, Alû is a vengeful spirit of the Utukku that goes down to the underworld Kur. The demon has no mouth, lips or ears. In Akkadian and Sumerian mythology, it is associated with other demons like Gallu and Lilu.";

// CMRC 2018, "泡泡战士"
const BUBBLE_FIGHTER: &str = "基于《跑跑卡丁车》与《泡泡堂》上所开发的游戏，由韩国Nexon开发与发行。中国大陆由盛大游戏运营，这是Nexon时隔6年再次授予盛大网络其游戏运营权。台湾由游戏橘子运营。";

// CMRC 2018, "中国（南京）国际象棋超级大赛"
const NANJING: &str = "中国（南京）国际象棋超级大赛（Pearl Spring Super Tournament）原名中国（南京）国际象棋特级大师邀请赛，首届比赛于2008年12月11日至22日在南京市浦口区明发珍珠泉大酒店举行。结果托帕洛夫夺得冠军，阿罗尼扬获得亚军，卜祥志获得第三名。";

#[test]
fn multi_word_names_and_the_title() {
    let mentions = english(DEMON_DICE, Some("Demon Dice"));
    let title = &mentions[0];
    assert_eq!(
        (title.kind, title.name.as_str(), title.count),
        (EntityKind::Title, "Demon Dice", 2)
    );
    assert_eq!(title.first_char, 0);
    assert_eq!(title.id, entity_id("demon dice"));
    for name in [
        "chaos progenitus",
        "lester smith",
        "dragon dice",
        "tim brown",
        "fast forward games",
        "hell",
    ] {
        assert_eq!(get(&mentions, name).kind, EntityKind::Name, "{name}");
    }
    assert_eq!(get(&mentions, "chaos progenitus").count, 2);
    // "Lester Smith ... and Tim Brown" stay two people
    assert!(find(&mentions, "lester smith and tim brown").is_none());
    let quoted = get(&mentions, "demon creation specialists junior grade");
    assert_eq!(quoted.kind, EntityKind::Quoted);
    assert_eq!(quoted.name, "Demon Creation Specialists, Junior Grade");
    // "In it", "The original", "Neither": sentence starts, no entities
    let all = canonicals(&mentions);
    for common in [
        "in",
        "it",
        "original",
        "neither",
        "the original chaos progenitus version",
    ] {
        assert!(!all.contains(common), "{common}");
    }
}

#[test]
fn first_char_is_a_char_offset() {
    let text = "Café Zürich is near Lake Geneva.";
    let mentions = english(text, None);
    let lake = get(&mentions, "lake geneva");
    let expected = text.chars().collect::<Vec<_>>();
    let at = lake.first_char as usize;
    assert_eq!(expected[at..at + 4].iter().collect::<String>(), "Lake");
    assert_eq!(get(&mentions, "café zürich").first_char, 0);
}

#[test]
fn connectors_inside_names() {
    let text = "He studied at the University of California and worked for the Bank of England, \
                then met Vincent van Gogh and Alexander the Great at the Department of Health \
                and Human Services.";
    let all_mentions = english(text, None);
    let all = canonicals(&all_mentions);
    for name in [
        "university of california",
        "bank of england",
        "vincent van gogh",
        "alexander the great",
        "department of health and human services",
    ] {
        assert!(all.contains(name), "{name} in {all:?}");
    }
}

#[test]
fn new_york_city_and_its_short_forms_fold() {
    let text = "New York City is large. Later, people in New York said York was old.";
    let mentions = english(text, None);
    let city = get(&mentions, "new york city");
    assert_eq!(city.count, 3);
    assert!(find(&mentions, "new york").is_none() && find(&mentions, "york").is_none());
}

#[test]
fn surnames_and_first_names_fold_into_the_full_name() {
    let text = "Scott Derrickson directed the film. Derrickson said that Scott liked it, and Derrickson's wife agreed.";
    let mentions = english(text, None);
    let scott = get(&mentions, "scott derrickson");
    assert_eq!(
        (scott.count, scott.first_char, scott.name.as_str()),
        (4, 0, "Scott Derrickson")
    );
    assert_eq!(mentions.len(), 1, "{mentions:#?}");
}

#[test]
fn an_ambiguous_surname_folds_nowhere() {
    let text = "John Smith met Jane Smith. Later Smith left.";
    let mentions = english(text, None);
    assert_eq!(get(&mentions, "smith").count, 1);
    assert_eq!(get(&mentions, "john smith").count, 1);
}

#[test]
fn a_surname_before_the_full_name_stays_apart() {
    let mentions = english(
        "They praised Derrickson. Scott Derrickson thanked them.",
        None,
    );
    assert!(find(&mentions, "derrickson").is_some());
}

#[test]
fn the_title_takes_its_surname_and_middle_name_forms() {
    let mentions = english(NOLAN, Some("Christopher Nolan"));
    let title = &mentions[0];
    assert_eq!(
        (title.kind, title.canonical.as_str(), title.count),
        (EntityKind::Title, "christopher nolan", 1)
    );
    assert!(
        find(&mentions, "christopher edward nolan").is_none(),
        "{mentions:#?}"
    );
    assert_eq!(get(&mentions, "1970-07-30").kind, EntityKind::Date);
    assert_eq!(get(&mentions, "english american").kind, EntityKind::Name);

    let later = english(
        "Nolan began as a child. Nolan's films made money.",
        Some("Christopher Nolan"),
    );
    assert_eq!(later.len(), 1, "{later:#?}");
    assert_eq!(later[0].count, 2);
}

#[test]
fn a_title_with_a_parenthetical() {
    let mentions = english(
        "Mercury is the smallest planet. Mercury has no moons.",
        Some("Mercury (planet)"),
    );
    assert_eq!(mentions[0].canonical, "mercury");
    assert_eq!(mentions[0].name, "Mercury (planet)");
    assert_eq!(mentions[0].count, 2);
    assert_eq!(mentions.len(), 1, "{mentions:#?}");
}

#[test]
fn a_title_never_named_counts_once_at_zero() {
    let mentions = english("Nothing here.", Some("  The   Great Gatsby "));
    assert_eq!(mentions.len(), 1);
    let title = &mentions[0];
    assert_eq!(
        (title.name.as_str(), title.canonical.as_str()),
        ("The Great Gatsby", "great gatsby")
    );
    assert_eq!((title.count, title.first_char), (1, 0));
    assert!(english("Nothing here.", Some(" ")).is_empty());
    assert!(english("Nothing here.", Some("—")).is_empty());
}

#[test]
fn acronyms_and_their_initials() {
    let text = "The World Health Organization (WHO) declared COVID-19 a pandemic; IL-6 rose. \
                NASA and the ESA agreed. WHO officials met NASA again.";
    let mentions = english(text, None);
    let who = get(&mentions, "world health organization");
    assert_eq!(who.count, 3);
    assert!(find(&mentions, "who").is_none());
    for acronym in ["covid 19", "il 6", "nasa", "esa"] {
        assert_eq!(
            get(&mentions, acronym).kind,
            EntityKind::Acronym,
            "{acronym}"
        );
    }
    assert_eq!(get(&mentions, "nasa").count, 2);
}

#[test]
fn common_word_acronyms_stand_only_as_initials() {
    // "IT" and "US" are words when shouted; kept only as the initials of a name in the text
    let mentions = english("IT WAS A DARK NIGHT. The United States (US) agreed.", None);
    let all = canonicals(&mentions);
    assert!(!all.contains("it") && !all.contains("was") && !all.contains("a"));
    assert_eq!(get(&mentions, "united states").count, 2);
    assert!(!all.contains("us"));
}

#[test]
fn initials_in_names() {
    let mentions = english(
        "John F. Kennedy visited the U.S. Army base with J. R. R. Tolkien.",
        None,
    );
    let all = canonicals(&mentions);
    assert!(all.contains("john f kennedy"), "{all:?}");
    assert!(all.contains("u s army"), "{all:?}");
    assert!(all.contains("j r r tolkien"), "{all:?}");
    let alone = english("Then troops of the U.S. landed.", None);
    assert_eq!(get(&alone, "u s").kind, EntityKind::Acronym);
}

#[test]
fn sentence_initial_single_words() {
    // "Paris" starts a sentence and is no common word; "Players" is written in lower case
    // elsewhere; "However" is common; "Nolan" is capitalised elsewhere too
    let text = "Paris is big. Players love it; the players cheer. However, it rained. \
                Nolan won. Critics praised Nolan.";
    let mentions = english(text, None);
    let all = canonicals(&mentions);
    assert!(all.contains("paris"));
    assert!(!all.contains("players"));
    assert!(!all.contains("however"));
    assert_eq!(get(&mentions, "nolan").count, 2);
    // in a sentence a capitalised word is a name
    assert!(canonicals(&english("We went to see Rome.", None)).contains("rome"));
}

#[test]
fn names_break_at_punctuation_lines_and_lower_case() {
    let mentions = english("Lester Smith, Tim Brown\nJane Doe and Hell", None);
    let all = canonicals(&mentions);
    for name in ["lester smith", "tim brown", "jane doe", "hell"] {
        assert!(all.contains(name), "{name} {all:?}");
    }
    assert_eq!(mentions.len(), 4, "{mentions:#?}");
}

#[test]
fn real_passages_give_their_names() {
    let mentions = english(KALATHIL, Some("Sathish Kalathil"));
    let all = canonicals(&mentions);
    for name in [
        "sathish kalathil",
        "malayalam cinema",
        "jalachhayam",
        "laloorinu parayanullathu",
        "2010",
        "2012",
    ] {
        assert!(all.contains(name), "{name} in {all:?}");
    }
    let mentions = english(ALU, Some("Alû"));
    assert_eq!(mentions[0].canonical, "alû");
    assert_eq!(mentions[0].count, 1);
    for name in ["akkadian", "sumerian", "utukku", "kur", "gallu", "lilu"] {
        assert_eq!(get(&mentions, name).kind, EntityKind::Name, "{name}");
    }
    assert_eq!(get(&mentions, "akkadian").count, 2);
}

#[test]
fn dates() {
    let text = "Born 12 March 1998, moved on March 14, 1999 and in May 2001; built 1998-03-12 \
                and in 1066. The 2000 km road; 1998年3月12日和2001年.";
    let mentions = extract(text, None, Language::Auto, &Limits::default());
    let date = |canonical: &str| get(&mentions, canonical);
    assert_eq!(date("1998-03-12").count, 3);
    assert_eq!(date("1998-03-12").name, "12 March 1998");
    assert_eq!(date("1999-03-14").name, "March 14, 1999");
    assert_eq!(date("2001-05").name, "May 2001");
    assert_eq!(date("1066").kind, EntityKind::Date);
    assert_eq!(date("2001").name, "2001年");
    assert!(find(&mentions, "2000").is_none(), "2000 km is a distance");
    assert!(
        mentions
            .iter()
            .filter(|m| m.kind == EntityKind::Date)
            .all(|m| !m.name.contains('和'))
    );
    // lower-case month names make dates too (queries)
    assert!(canonicals(&english("what happened in march 1998", None)).contains("1998-03"));
    // out of range
    assert!(
        english("In 999 and 2100 and 13 Foo 2000.", None)
            .iter()
            .all(|m| m.canonical != "999" && m.canonical != "2100")
    );
}

#[test]
fn quantities() {
    let text = "Take 5 mg twice, walk 3.5 km, pay $4 million or €20, 20% off, at 37 °C, a 5mg pill, \
                1,000 km away and 60 W.";
    let mentions = english(text, None);
    for (canonical, name) in [
        ("5 mg", "5 mg"),
        ("3.5 km", "3.5 km"),
        ("$4 million", "$4 million"),
        ("€20", "€20"),
        ("20%", "20%"),
        ("37 °c", "37 °C"),
        ("1000 km", "1,000 km"),
        ("60 w", "60 W"),
    ] {
        let mention = get(&mentions, canonical);
        assert_eq!(
            (mention.kind, mention.name.as_str()),
            (EntityKind::Quantity, name)
        );
    }
    assert_eq!(get(&mentions, "5 mg").count, 2, "\"5mg\" is \"5 mg\"");
    // a number without a unit is nothing
    assert!(english("He had 13 dice.", None).is_empty());
}

#[test]
fn quoted_terms() {
    let text = "Called 'the demon', the “Blue Book” and «Le Monde» differ from \"a very long quoted phrase of more than six words here\".";
    let mentions = english(text, None);
    let all = canonicals(&mentions);
    assert!(
        all.contains("demon") && all.contains("blue book") && all.contains("le monde"),
        "{all:?}"
    );
    assert!(!all.iter().any(|name| name.contains("long quoted")));
    assert_eq!(get(&mentions, "demon").kind, EntityKind::Quoted);
    // apostrophes are no quotes
    assert!(
        english("Nolan's film isn't O'Brien's.", None)
            .iter()
            .all(|m| m.kind != EntityKind::Quoted)
    );
}

#[test]
fn chinese_names_places_and_book_titles() {
    let mentions = extract(
        BUBBLE_FIGHTER,
        Some("泡泡战士"),
        Language::Chinese,
        &Limits::default(),
    );
    assert_eq!(mentions[0].canonical, "泡泡战士");
    assert_eq!(get(&mentions, "nexon").count, 2);
    assert_eq!(get(&mentions, "nexon").kind, EntityKind::Name);
    assert_eq!(get(&mentions, "韩国").kind, EntityKind::Place);
    assert_eq!(get(&mentions, "台湾").kind, EntityKind::Place);
    assert_eq!(get(&mentions, "跑跑卡丁车").kind, EntityKind::Quoted);
    assert_eq!(get(&mentions, "泡泡堂").kind, EntityKind::Quoted);
    let nexon = get(&mentions, "nexon");
    let chars: Vec<char> = BUBBLE_FIGHTER.chars().collect();
    let at = nexon.first_char as usize;
    assert_eq!(chars[at..at + 5].iter().collect::<String>(), "Nexon");
    // English rules only: no jieba
    let english_only = extract(BUBBLE_FIGHTER, None, Language::English, &Limits::default());
    assert!(find(&english_only, "韩国").is_none() && find(&english_only, "nexon").is_some());
}

#[test]
fn chinese_people_dates_and_the_title() {
    let title = "中国（南京）国际象棋超级大赛";
    let mentions = extract(NANJING, Some(title), Language::Auto, &Limits::default());
    assert_eq!(mentions[0].canonical, "中国 南京 国际象棋超级大赛");
    assert_eq!(mentions[0].count, 1);
    assert_eq!(get(&mentions, "2008-12-11").name, "2008年12月11日");
    assert_eq!(
        get(&mentions, "pearl spring super tournament").kind,
        EntityKind::Name
    );
    assert_eq!(get(&mentions, "南京市").kind, EntityKind::Place);
    // a transliterated name cut in pieces by the HMM is put together again
    for person in ["托帕洛夫", "阿罗尼扬", "卜祥志"] {
        assert_eq!(get(&mentions, person).kind, EntityKind::Person, "{person}");
    }
    // a Chinese prefix is not a short form
    assert!(find(&mentions, "中国").is_some());
    // a title jieba cuts in two is counted where it is written
    let kangaroo = extract(
        "尤金袋鼠分布在澳洲南部岛屿。尤金袋鼠很细小。",
        Some("尤金袋鼠"),
        Language::Auto,
        &Limits::default(),
    );
    assert_eq!((kangaroo[0].count, kangaroo[0].first_char), (2, 0));
    assert_eq!(get(&kangaroo, "澳洲").kind, EntityKind::Place);
}

#[test]
fn full_width_latin_folds() {
    let mentions = extract(
        "由ＮＡＳＡ和NASA发射。",
        None,
        Language::Auto,
        &Limits::default(),
    );
    let nasa = get(&mentions, "nasa");
    assert_eq!((nasa.count, nasa.name.as_str()), (2, "ＮＡＳＡ"));
}

#[test]
fn the_cap_keeps_the_title_then_the_most_frequent() {
    let text = "Alpha Beta met Gamma Delta. Gamma Delta met Epsilon Zeta. Gamma Delta and Alpha Beta left.";
    let limits = Limits {
        max_entities: 2,
        ..Limits::default()
    };
    let mentions = extract(text, Some("Omega"), Language::English, &limits);
    let names: Vec<_> = mentions.iter().map(|m| m.canonical.as_str()).collect();
    assert_eq!(names, ["omega", "gamma delta"]);
    let limits = Limits {
        max_entities: 3,
        ..Limits::default()
    };
    let names: Vec<_> = extract(text, None, Language::English, &limits)
        .into_iter()
        .map(|m| m.canonical)
        .collect();
    assert_eq!(names, ["gamma delta", "alpha beta", "epsilon zeta"]);
    let none = Limits {
        max_entities: 0,
        ..Limits::default()
    };
    assert!(extract(text, Some("Omega"), Language::English, &none).is_empty());
}

#[test]
fn long_names_are_dropped() {
    let limits = Limits {
        max_name_chars: 10,
        ..Limits::default()
    };
    let mentions = extract(
        "We met Ann Lee and Bartholomew Montgomery.",
        None,
        Language::English,
        &limits,
    );
    let all = canonicals(&mentions);
    assert!(all.contains("ann lee") && !all.contains("bartholomew montgomery"));
}

#[test]
fn twenty_thousand_distinct_capitalised_words_stay_under_the_cap() {
    let mut text = String::new();
    for i in 0..20_000u32 {
        // distinct words, none common: "Qbcd", "Qbce", …, each in its own clause
        let word: String = format!("{i:05}")
            .chars()
            .map(|d| (b'a' + d as u8 - b'0') as char)
            .collect();
        text.push_str("then Q");
        text.push_str(&word);
        text.push_str(", ");
    }
    let limits = Limits::default();
    let mentions = extract(&text, Some("Doc"), Language::Auto, &limits);
    assert_eq!(mentions.len(), limits.max_entities);
    assert_eq!(mentions[0].kind, EntityKind::Title);
    // all counts are 1: ties go to the first occurrences
    assert_eq!(mentions[1].canonical, "qaaaaa");
}

#[test]
fn a_megabyte_of_text() {
    let passage = format!("{DEMON_DICE} {NOLAN} {KALATHIL} {ALU} ");
    let mut text = String::with_capacity(1 << 20);
    let mut i = 0u32;
    while text.len() < 1 << 20 {
        text.push_str(&passage);
        text.push_str(&format!("Entity{i} met Person{i} in 19{:02}. ", i % 100));
        i += 1;
    }
    let started = std::time::Instant::now();
    let mentions = extract(
        &text,
        Some("Demon Dice"),
        Language::Auto,
        &Limits::default(),
    );
    let elapsed = started.elapsed();
    assert!(mentions.len() <= Limits::default().max_entities);
    assert_eq!(mentions[0].canonical, "demon dice");
    assert!(mentions[0].count > 1000);
    println!("1 MiB extracted in {elapsed:?}");
    let han: String = BUBBLE_FIGHTER.repeat((1 << 20) / BUBBLE_FIGHTER.len() + 1);
    let mentions = extract(&han, None, Language::Auto, &Limits::default());
    assert!(mentions.len() <= Limits::default().max_entities && !mentions.is_empty());
}

#[test]
fn query_names_meet_lower_case_queries() {
    let names = query_names("who directed doctor strange", Language::Auto);
    let id = entity_id(&canonical("Doctor Strange"));
    assert!(
        names
            .iter()
            .any(|(name, name_id)| name == "doctor strange" && *name_id == id),
        "{names:?}"
    );
    assert!(
        !names
            .iter()
            .any(|(name, _)| name == "who" || name == "who directed"),
        "{names:?}"
    );
    for (name, name_id) in &names {
        assert_eq!(entity_id(name), *name_id);
    }

    let names: Vec<String> = query_names(
        "Are Christopher Nolan and Sathish Kalathil both film directors?",
        Language::Auto,
    )
    .into_iter()
    .map(|(name, _)| name)
    .collect();
    assert_eq!(names[0], "christopher nolan");
    assert_eq!(names[1], "sathish kalathil");
    assert!(names.contains(&"film directors".to_string()));

    let names: Vec<String> = query_names(
        "what did the bank of england say in march 1998?",
        Language::English,
    )
    .into_iter()
    .map(|(name, _)| name)
    .collect();
    assert!(
        names.contains(&"bank of england".to_string()) && names.contains(&"1998-03".to_string()),
        "{names:?}"
    );
    assert!(names.contains(&"england".to_string()));
}

#[test]
fn query_names_of_wikipedia_style_titles() {
    // HotpotQA questions whose supporting titles are "Leland, North Carolina",
    // "In Love and War (1987 film)", "Never Cry Wolf (film)", "Vicious Lies and Dangerous Rumors"
    let cases = [
        (
            "Who directed the film that was shot in or around Leland, North Carolina in 1986",
            "Leland, North Carolina",
        ),
        (
            "The real life person that James Woods' character is based on in the television film In Love and War was awarded what medal?",
            "In Love and War (1987 film)",
        ),
        (
            "Both Never Cry Wolf and Big Hero 6 films were released by what label?",
            "Never Cry Wolf (film)",
        ),
        (
            "Vicious Lies and Dangerous Rumors featured a guest appearance by which rapper?",
            "Vicious Lies and Dangerous Rumors",
        ),
    ];
    for (question, title) in cases {
        let id = entity_id(&canonical(title));
        let names = query_names(question, Language::Auto);
        assert!(
            names.iter().any(|(_, name_id)| *name_id == id),
            "{title}: {names:?}"
        );
    }
}

#[test]
fn query_names_are_few_and_distinct() {
    let long = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon phi chi psi omega";
    let names = query_names(long, Language::Auto);
    assert_eq!(names.len(), 64);
    let distinct: HashSet<_> = names.iter().map(|(name, _)| name).collect();
    assert_eq!(distinct.len(), names.len());
    assert!(query_names("", Language::Auto).is_empty());
    assert!(query_names("the of and?", Language::Auto).is_empty());
}

#[test]
fn chinese_query_names() {
    // CMRC 2018 trial question
    let names: Vec<String> = query_names("泡泡战士由哪个韩国公司开发？", Language::Chinese)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert!(names.contains(&"韩国".to_string()), "{names:?}");
    assert!(
        !names.contains(&"哪个".to_string()) && !names.contains(&"由".to_string()),
        "{names:?}"
    );
    // 泡泡 + 战士: a pair of adjacent words
    assert!(names.contains(&"泡泡战士".to_string()), "{names:?}");
    // no jieba for English
    assert!(query_names("韩国", Language::English).is_empty());
}

#[test]
fn language_settings() {
    assert_eq!(Language::from_setting("zh"), Language::Chinese);
    assert_eq!(Language::from_setting("zh-CN"), Language::Chinese);
    assert_eq!(Language::from_setting("zh_Hans"), Language::Chinese);
    assert_eq!(Language::from_setting("EN"), Language::English);
    assert_eq!(Language::from_setting("en-GB"), Language::English);
    assert_eq!(Language::from_setting("auto"), Language::Auto);
    assert_eq!(Language::from_setting(""), Language::Auto);
    assert_eq!(Language::from_setting("fr"), Language::Auto);
}

#[test]
fn kinds_serialise_as_their_names() {
    for kind in EntityKind::ALL {
        assert_eq!(
            serde_json::to_string(&kind).unwrap(),
            format!("\"{}\"", kind.as_str())
        );
        let back: EntityKind = serde_json::from_str(&format!("\"{}\"", kind.as_str())).unwrap();
        assert_eq!(back, kind);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn extract_never_panics_and_keeps_the_cap(
        text in "\\PC{0,400}",
        title in proptest::option::of("\\PC{0,30}"),
        cap in 0usize..6,
        max_name_chars in 0usize..20,
    ) {
        let limits = Limits { max_entities: cap, max_name_chars };
        for language in [Language::English, Language::Auto] {
            let mentions = extract(&text, title.as_deref(), language, &limits);
            prop_assert!(mentions.len() <= cap);
            let text_chars = text.chars().count() as u32;
            for mention in &mentions {
                prop_assert_eq!(mention.id, entity_id(&mention.canonical));
                prop_assert!(!mention.canonical.is_empty());
                prop_assert!(mention.count >= 1);
                prop_assert!(mention.first_char <= text_chars);
                if mention.kind != EntityKind::Title {
                    prop_assert!(mention.name.chars().count() <= max_name_chars);
                }
            }
            let distinct: HashSet<_> = mentions.iter().map(|m| m.id).collect();
            prop_assert_eq!(distinct.len(), mentions.len());
        }
    }

    #[test]
    fn extract_on_name_like_text(
        words in proptest::collection::vec(
            prop_oneof![
                "[A-Z][a-z]{1,6}", "[A-Z]{2,5}", "of|the|and|van|de", "[a-z]{1,5}", "[0-9]{1,4}",
                "[.,;:!?()\"'“”«»&%$-]", "[A-Z]\\.", "(Mr|Dr|St)\\.", "\n", "[一-龥]{1,4}",
                "January|March|May", "mg|km|million|°C",
            ],
            0..80,
        ),
    ) {
        let text = words.join(" ");
        let limits = Limits { max_entities: 8, ..Limits::default() };
        let mentions = extract(&text, Some("Title Here"), Language::Auto, &limits);
        prop_assert!(mentions.len() <= 8);
        prop_assert_eq!(mentions[0].kind, EntityKind::Title);
        let joined = words.concat();
        let _ = extract(&joined, None, Language::English, &limits);
    }

    #[test]
    fn query_names_never_panic(query in "\\PC{0,200}") {
        let names = query_names(&query, Language::Auto);
        prop_assert!(names.len() <= 64);
        for (name, id) in &names {
            prop_assert_eq!(entity_id(name), *id);
        }
    }

    #[test]
    fn canonical_never_panics_and_has_no_outer_spaces(name in "\\PC{0,60}") {
        let folded = canonical(&name);
        prop_assert_eq!(folded.trim(), folded.as_str());
        prop_assert!(!folded.contains("  "));
    }
}

// --- measurements on the shared collections (ignored: they need /work/shared/data) ---

struct Passage {
    id: String,
    title: String,
    text: String,
}

fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

fn hotpot_dir() -> std::path::PathBuf {
    std::env::var_os("SIFT_HOTPOTQA100")
        .map(Into::into)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/hotpotqa100")
        })
}

fn hotpot_passages() -> Vec<Passage> {
    read_jsonl(&hotpot_dir().join("corpus.jsonl"))
        .into_iter()
        .map(|row| Passage {
            id: row["_id"].as_str().unwrap_or_default().to_string(),
            title: row["title"].as_str().unwrap_or_default().to_string(),
            text: row["text"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

/// Microseconds per chunk over the hotpotqa100 passages (run in release or with this crate's
/// opt-level 3: `cargo test -p sift-graph --release -- --ignored --nocapture timing`).
#[test]
#[ignore]
fn timing_per_hotpotqa_passage() {
    let passages = hotpot_passages();
    let limits = Limits::default();
    // warm: the jieba dictionary loads on first use
    let _ = extract("北京", None, Language::Auto, &limits);
    for language in [Language::English, Language::Auto] {
        let rounds = 20;
        let started = std::time::Instant::now();
        let mut entities = 0usize;
        for _ in 0..rounds {
            for passage in &passages {
                entities += extract(&passage.text, Some(&passage.title), language, &limits).len();
            }
        }
        let per_chunk = started.elapsed().as_secs_f64() * 1e6 / (rounds * passages.len()) as f64;
        let mean_chars = passages
            .iter()
            .map(|p| p.text.chars().count())
            .sum::<usize>()
            / passages.len();
        println!(
            "{language:?}: {per_chunk:.1} µs per passage ({} passages, mean {mean_chars} chars, {:.1} entities each)",
            passages.len(),
            entities as f64 / (rounds * passages.len()) as f64
        );
    }
}

/// Does bridging work: for each hotpotqa100 question, the share of its supporting passages'
/// titles found among `query_names(question)` or among the entities of another supporting
/// passage.
#[test]
#[ignore]
fn bridging_on_hotpotqa() {
    let dir = hotpot_dir();
    let passages = hotpot_passages();
    let by_id: std::collections::HashMap<&str, &Passage> =
        passages.iter().map(|p| (p.id.as_str(), p)).collect();
    let questions: std::collections::HashMap<String, String> =
        read_jsonl(&dir.join("queries.jsonl"))
            .into_iter()
            .map(|row| {
                (
                    row["_id"].as_str().unwrap_or_default().to_string(),
                    row["text"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
    let mut supports: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let qrels = std::fs::read_to_string(dir.join("qrels/test.tsv")).expect("qrels");
    for line in qrels.lines().skip(1) {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() >= 2 {
            supports
                .entry(fields[0].to_string())
                .or_default()
                .push(fields[1].to_string());
        }
    }
    let limits = Limits::default();
    let (mut titles, mut by_query, mut by_passage, mut by_either) = (0, 0, 0, 0);
    let mut questions_all_found = 0;
    let mut missed = vec![];
    for (query_id, corpus_ids) in &supports {
        let question = &questions[query_id];
        let query_ids: HashSet<EntityId> = query_names(question, Language::Auto)
            .into_iter()
            .map(|(_, id)| id)
            .collect();
        let mut all_found = true;
        for corpus_id in corpus_ids {
            let support = by_id[corpus_id.as_str()];
            let title_id = entity_id(&canonical(&support.title));
            let in_query = query_ids.contains(&title_id);
            let in_other = corpus_ids
                .iter()
                .filter(|other| *other != corpus_id)
                .any(|other| {
                    let other = by_id[other.as_str()];
                    extract(&other.text, Some(&other.title), Language::Auto, &limits)
                        .iter()
                        .any(|mention| mention.id == title_id)
                });
            titles += 1;
            by_query += usize::from(in_query);
            by_passage += usize::from(in_other);
            by_either += usize::from(in_query || in_other);
            if !(in_query || in_other) {
                all_found = false;
                missed.push(format!("{:?} <- {question:?}", support.title));
            }
        }
        questions_all_found += usize::from(all_found);
    }
    let share = |n: usize| 100.0 * n as f64 / titles as f64;
    println!(
        "{titles} supporting titles of {} questions: in query_names {:.1}%, in another support's entities {:.1}%, either {:.1}%; questions with every title found {}",
        supports.len(),
        share(by_query),
        share(by_passage),
        share(by_either),
        questions_all_found
    );
    for line in missed.iter().take(25) {
        println!("missed {line}");
    }
}
