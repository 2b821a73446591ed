//! Link following: the second hop of a multi-hop question. A document that one of the top hits
//! names by its title ("... shot in Leland, North Carolina" names the document "Leland, North
//! Carolina") is moved up to just after the hit that names it, when the query already
//! retrieved it among the candidates. It is the entity bridge of the Artoo seed with document
//! titles as the entities: no graph to extract, and nothing outside the candidate list is
//! fetched, so a link can only reorder evidence the query found relevant on its own.
//!
//! One link goes the other way (a *backlink*): the best document below the linkers whose text
//! names the first hit's title follows the linkers ("Hannah Gross is the daughter of Paul
//! Gross" behind the hit "Paul Gross", for a question about whom Paul Gross had a child
//! with). It is placed after the linkers, not between them, so that the two top hits of a
//! question about two things keep their places.
//!
//! Titles and texts are compared as sequences of words (maximal runs of letters and digits,
//! case kept; CJK characters one word each). A trailing parenthetical in a title
//! ("Charmed (TV series)") is dropped, titles shorter than 4 characters (2 CJK) or longer than
//! [`MAX_TITLE_WORDS`] words are never linked, and a hit does not link to documents with its
//! own title (sections of one article).

use std::collections::{HashMap, HashSet};

/// Titles longer than this are sentences (paper titles), not names.
pub const MAX_TITLE_WORDS: usize = 12;

/// What link following looks at: one hit (a chunk) of the fused list.
#[derive(Clone, Copy, Debug)]
pub struct LinkView<'a> {
    pub document_id: &'a str,
    pub title: &'a str,
    pub text: &'a str,
}

/// A move made by [`follow`]: the hit at `moved` (original index) now follows the hit at
/// `linker` (original index), which names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub moved: usize,
    pub linker: usize,
    /// The moved hit names the linker (a backlink), rather than the other way round.
    pub backlink: bool,
}

fn is_cjk(c: char) -> bool {
    ('\u{4e00}'..='\u{9fff}').contains(&c)
}

/// The words of `text`: runs of letters and digits, CJK characters one each, case kept.
fn words(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (at, c) in text.char_indices() {
        let cjk = is_cjk(c);
        if c.is_alphanumeric() && !cjk {
            start.get_or_insert(at);
            continue;
        }
        if let Some(from) = start.take() {
            out.push(&text[from..at]);
        }
        if cjk {
            out.push(&text[at..at + c.len_utf8()]);
        }
    }
    if let Some(from) = start {
        out.push(&text[from..]);
    }
    out
}

/// The key a title is linked by, or `None` when it is too short or too long to be a name.
fn title_key(title: &str) -> Option<String> {
    let mut title = title.trim();
    if title.ends_with(')')
        && let Some(open) = title.rfind('(')
        && open > 0
    {
        title = title[..open].trim_end();
    }
    let words = words(title);
    if words.is_empty() || words.len() > MAX_TITLE_WORDS {
        return None;
    }
    let chars: usize = words.iter().map(|word| word.chars().count()).sum();
    let cjk = words
        .iter()
        .all(|word| word.chars().next().is_some_and(is_cjk));
    let named = title.chars().any(char::is_alphabetic);
    if !named || chars < if cjk { 2 } else { 4 } {
        return None;
    }
    Some(words.join(" "))
}

/// Whether `text` holds the words of `key` in a row.
fn names(text: &[&str], key: &[&str]) -> bool {
    !key.is_empty() && text.windows(key.len()).any(|window| window == key)
}

/// Reorders `hits` (best first): every document named in one of the first `from` documents'
/// hits and found lower in the list moves to just after the hit that names it, at most
/// `per_hit` of them per naming hit, in their own order; then the best document below the
/// first `from` that names the first hit's title (a backlink) follows them. Returns the new
/// order (original indexes) and the moves made.
pub fn follow(hits: &[LinkView<'_>], from: usize, per_hit: usize) -> (Vec<usize>, Vec<Link>) {
    let identity = || (0..hits.len()).collect::<Vec<_>>();
    if from == 0 || per_hit == 0 || hits.len() < 2 {
        return (identity(), Vec::new());
    }
    // Each document's first (best) hit, and the titles of those documents.
    let mut first_hit: HashMap<&str, usize> = HashMap::new();
    for (index, hit) in hits.iter().enumerate() {
        first_hit.entry(hit.document_id).or_insert(index);
    }
    let keys: Vec<Option<String>> = hits
        .iter()
        .enumerate()
        .map(|(index, hit)| {
            (first_hit[hit.document_id] == index)
                .then(|| title_key(hit.title))
                .flatten()
        })
        .collect();
    let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
    for (index, key) in keys.iter().enumerate() {
        if let Some(key) = key {
            by_key.entry(key.as_str()).or_default().push(index);
        }
    }
    let longest = by_key
        .keys()
        .map(|key| key.split(' ').count())
        .max()
        .unwrap_or(0);
    if longest == 0 {
        return (identity(), Vec::new());
    }

    let texts: Vec<Vec<&str>> = hits.iter().map(|hit| words(hit.text)).collect();
    // The first hit's backlink (below), placed once the linkers are done.
    let mut backlink: Option<Link> = None;
    let mut order = Vec::with_capacity(hits.len());
    let mut moved: HashSet<usize> = HashSet::new();
    let mut links = Vec::new();
    let mut linkers = 0;
    for (index, hit) in hits.iter().enumerate() {
        if moved.contains(&index) {
            continue;
        }
        order.push(index);
        if first_hit[hit.document_id] != index || linkers >= from {
            continue;
        }
        linkers += 1;
        let own_key = keys[index].as_deref();
        let text = &texts[index];
        let mut named: Vec<usize> = Vec::new();
        for start in 0..text.len() {
            let mut key = String::new();
            for (n, word) in text[start..].iter().take(longest).enumerate() {
                if n > 0 {
                    key.push(' ');
                }
                key.push_str(word);
                let Some(targets) = by_key.get(key.as_str()) else {
                    continue;
                };
                if own_key == Some(key.as_str()) {
                    continue;
                }
                named.extend(targets.iter().copied().filter(|target| {
                    *target > index
                        && !moved.contains(target)
                        && hits[*target].document_id != hit.document_id
                }));
            }
        }
        // Backlinks: a candidate whose text names this hit's own title ("Hannah Gross is the
        // daughter of Paul Gross" behind the hit "Paul Gross"), the hop a question about the
        // top hit's subject needs next.
        if linkers == 1
            && let Some(own) = own_key
        {
            let own: Vec<&str> = own.split(' ').collect();
            // Past the other linkers: a top hit naming it is already where it belongs.
            for target in (index + 1).max(from + 1)..hits.len() {
                if moved.contains(&target)
                    || hits[target].document_id == hit.document_id
                    || first_hit[hits[target].document_id] != target
                {
                    continue;
                }
                if names(&texts[target], &own) && !named.contains(&target) {
                    moved.insert(target);
                    backlink = Some(Link {
                        moved: target,
                        linker: index,
                        backlink: true,
                    });
                    break;
                }
            }
        }
        named.sort_unstable();
        named.dedup();
        for target in named.into_iter().take(per_hit) {
            order.push(target);
            moved.insert(target);
            links.push(Link {
                moved: target,
                linker: index,
                backlink: false,
            });
        }
        // The backlink goes after the linkers' own block, not between them: the top hits of a
        // question about two things keep their places.
        if linkers == from
            && let Some(link) = backlink.take()
        {
            order.push(link.moved);
            links.push(link);
        }
    }
    if let Some(link) = backlink {
        order.push(link.moved);
        links.push(link);
    }
    (order, links)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit<'a>(document_id: &'a str, title: &'a str, text: &'a str) -> LinkView<'a> {
        LinkView {
            document_id,
            title,
            text,
        }
    }

    #[test]
    fn titles_become_keys_without_their_disambiguation() {
        assert_eq!(
            title_key("Leland, North Carolina").as_deref(),
            Some("Leland North Carolina")
        );
        assert_eq!(title_key("Charmed (TV series)").as_deref(), Some("Charmed"));
        assert_eq!(title_key("Sergio Agüero").as_deref(), Some("Sergio Agüero"));
        assert_eq!(title_key("IBM").as_deref(), None, "too short");
        assert_eq!(title_key("北京").as_deref(), Some("北 京"));
        assert_eq!(title_key("(1995)"), None, "no letters");
        assert_eq!(title_key("2001"), None, "a number is not a name");
        let sentence =
            "A randomized trial of thirteen different things in one very long and wordy title";
        assert_eq!(title_key(sentence), None, "a sentence is not a name");
    }

    #[test]
    fn a_named_document_moves_up_behind_the_hit_naming_it() {
        let hits = [
            hit(
                "d1",
                "Leland, North Carolina",
                "Leland is a town. Maximum Overdrive was filmed here in 1986.",
            ),
            hit("d2", "Chloë Leland", "An actress."),
            hit("d3", "1986 football team", "A season."),
            hit(
                "d4",
                "Maximum Overdrive",
                "A 1986 film directed by Stephen King.",
            ),
        ];
        let (order, links) = follow(&hits, 3, 2);
        assert_eq!(order, vec![0, 3, 1, 2]);
        assert_eq!(
            links,
            vec![Link {
                moved: 3,
                linker: 0,
                backlink: false
            }]
        );
    }

    #[test]
    fn only_the_first_documents_link_and_at_most_per_hit_each() {
        let hits = [
            hit("a", "Alpha", "Names Gamma Delta and Epsilon."),
            hit("b", "Beta", "Names Zeta."),
            hit("c", "Gamma", "-"),
            hit("d", "Delta", "-"),
            hit("e", "Epsilon", "-"),
            hit("z", "Zeta", "-"),
        ];
        // Alpha links Gamma and Delta (list order), not Epsilon; Beta is not among the first 1.
        let (order, _) = follow(&hits, 1, 2);
        assert_eq!(order, vec![0, 2, 3, 1, 4, 5]);
        // With two linkers, Beta links Zeta too.
        let (order, links) = follow(&hits, 2, 2);
        assert_eq!(order, vec![0, 2, 3, 1, 5, 4]);
        assert_eq!(links.len(), 3);
    }

    #[test]
    fn the_first_hit_draws_one_document_naming_it_behind_the_linkers() {
        let hits = [
            hit("a", "Paul Gross", "A Canadian actor."),
            hit("b", "Due South", "A series starring Paul Gross."),
            hit("c", "Benton Fraser", "A constable."),
            hit("x", "Lake", "Water."),
            hit("h", "Hannah Gross", "The daughter of Paul Gross."),
            hit("i", "Other", "Also names Paul Gross."),
        ];
        // "Due South" names Paul Gross but is one of the linkers, in place already; the best
        // document below them that names him follows the linkers, once.
        let (order, links) = follow(&hits, 3, 2);
        assert_eq!(order, vec![0, 1, 2, 4, 3, 5]);
        assert_eq!(
            links,
            vec![Link {
                moved: 4,
                linker: 0,
                backlink: true
            }]
        );
        // With one linker it follows that hit at once.
        let (order, _) = follow(&hits, 1, 2);
        assert_eq!(order, vec![0, 4, 1, 2, 3, 5]);
        // Only the first hit draws one: nothing names "Due South" below, and "Benton Fraser"
        // draws none.
        let (order, links) = follow(&hits[1..], 3, 2);
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
        assert!(links.is_empty());
    }

    #[test]
    fn no_links_upward_to_itself_or_to_its_own_title() {
        let hits = [
            hit("a", "Gamma", "-"),
            hit(
                "b",
                "Beta Article",
                "Beta Article, part one, names Gamma and Beta Article.",
            ),
            hit("c", "Beta Article", "Part two."),
            hit("b", "Beta Article", "Another chunk of b."),
        ];
        // Gamma is already above; the other part of "Beta Article" is a sibling, not a link.
        let (order, links) = follow(&hits, 3, 2);
        assert_eq!(order, vec![0, 1, 2, 3]);
        assert!(links.is_empty());
    }

    #[test]
    fn case_and_word_boundaries_matter() {
        let hits = [
            hit(
                "a",
                "Start",
                "the neighbours moved to Charmedville; charmed, they said.",
            ),
            hit("b", "Neighbours", "-"),
            hit("c", "Charmed (TV series)", "-"),
        ];
        let (order, links) = follow(&hits, 3, 2);
        assert_eq!(order, vec![0, 1, 2]);
        assert!(links.is_empty());
    }

    #[test]
    fn chinese_titles_link_by_characters() {
        let hits = [
            hit("a", "长城", "长城位于北京市北部，八达岭是其中一段。"),
            hit("b", "上海", "-"),
            hit("c", "八达岭", "-"),
        ];
        let (order, _) = follow(&hits, 1, 2);
        assert_eq!(order, vec![0, 2, 1]);
    }
}
