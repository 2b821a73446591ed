//! A flat walk over an XML part: opening tags with their attributes, closing tags and text,
//! with entity and character references resolved. Element names are local (`w:p` -> `p`): the parts we
//! read use one prefix per vocabulary, and matching on local names survives documents written
//! with other prefixes. Nothing recurses, so nesting depth costs no stack.

use quick_xml::events::{BytesStart, Event};
use quick_xml::reader::Reader;

use crate::parse::ParseError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// An opening tag (a self-closing one is followed by its [`Node::Close`]).
    Open {
        name: String,
        /// Qualified names (`w:val`) and unescaped values.
        attributes: Vec<(String, String)>,
    },
    Close {
        name: String,
    },
    Text(String),
}

impl Node {
    pub(crate) fn is_open(&self, local: &str) -> bool {
        matches!(self, Node::Open { name, .. } if name == local)
    }

    pub(crate) fn is_close(&self, local: &str) -> bool {
        matches!(self, Node::Close { name } if name == local)
    }

    /// The value of the attribute whose local name is `local` (`w:val` for `"val"`).
    pub(crate) fn attribute(&self, local: &str) -> Option<&str> {
        self.find_attribute(|key| key.rsplit(':').next() == Some(local))
    }

    /// The value of a namespaced attribute whose local name is `local` (`r:id` for `"id"`,
    /// where the element also has a plain `id`).
    pub(crate) fn prefixed_attribute(&self, local: &str) -> Option<&str> {
        self.find_attribute(|key| {
            key.split_once(':')
                .is_some_and(|(prefix, name)| prefix != "xmlns" && name == local)
        })
    }

    fn find_attribute(&self, matches: impl Fn(&str) -> bool) -> Option<&str> {
        match self {
            Node::Open { attributes, .. } => attributes
                .iter()
                .find(|(key, _)| matches(key))
                .map(|(_, value)| value.as_str()),
            _ => None,
        }
    }
}

/// Leaves out what lies inside `mc:Fallback`, the copy of a drawing Office keeps for older
/// readers: fed every node in order, it says whether the node is inside one (the `Fallback`
/// element itself included).
#[derive(Debug, Default)]
pub(crate) struct FallbackSkip {
    depth: usize,
}

impl FallbackSkip {
    pub(crate) fn skips(&mut self, node: &Node) -> bool {
        if node.is_open("Fallback") {
            self.depth += 1;
            return true;
        }
        if self.depth > 0 {
            if node.is_close("Fallback") {
                self.depth -= 1;
            }
            return true;
        }
        false
    }
}

pub(crate) struct XmlWalker<'a> {
    reader: Reader<&'a [u8]>,
    /// The closing tag owed by a self-closing one.
    pending_close: Option<String>,
    part: String,
}

impl<'a> XmlWalker<'a> {
    /// Walks `xml`; `part` names it in error messages.
    pub(crate) fn new(xml: &'a str, part: &str) -> Self {
        XmlWalker {
            reader: Reader::from_reader(xml.as_bytes()),
            pending_close: None,
            part: part.to_string(),
        }
    }

    /// The next node, `None` at the end of the part.
    pub(crate) fn next_node(&mut self) -> Result<Option<Node>, ParseError> {
        if let Some(name) = self.pending_close.take() {
            return Ok(Some(Node::Close { name }));
        }
        loop {
            let event = self.reader.read_event().map_err(|error| {
                ParseError::InvalidDocument(format!("malformed XML in {}: {error}", self.part))
            })?;
            return Ok(Some(match event {
                Event::Start(start) => open_node(&start),
                Event::Empty(start) => {
                    let node = open_node(&start);
                    if let Node::Open { name, .. } = &node {
                        self.pending_close = Some(name.clone());
                    }
                    node
                }
                Event::End(end) => Node::Close {
                    name: end.local_name().as_ref().to_string(),
                },
                Event::Text(text) => Node::Text(text.xml10_content().into_owned()),
                Event::CData(data) => Node::Text(data.xml10_content().into_owned()),
                Event::GeneralRef(reference) => {
                    let resolved = match reference.resolve_char_ref() {
                        Ok(Some(c)) => c.to_string(),
                        _ => quick_xml::escape::resolve_xml_entity(reference.as_ref())
                            .unwrap_or("")
                            .to_string(),
                    };
                    Node::Text(resolved)
                }
                Event::Eof => return Ok(None),
                _ => continue,
            }));
        }
    }
}

fn open_node(start: &BytesStart<'_>) -> Node {
    let attributes = start
        .attributes()
        .with_checks(false)
        .filter_map(|attribute| attribute.ok())
        .map(|attribute| {
            let key = attribute.key.as_ref().to_string();
            let value = attribute
                .normalized_value(quick_xml::XmlVersion::Implicit1_0)
                .map(|value| value.into_owned())
                .unwrap_or_else(|_| attribute.value.to_string());
            (key, value)
        })
        .collect();
    Node::Open {
        name: start.local_name().as_ref().to_string(),
        attributes,
    }
}

/// The local name of the root element of `xml` (`None` when it has none).
pub(crate) fn root_name(xml: &str, part: &str) -> Result<Option<String>, ParseError> {
    let mut walker = XmlWalker::new(xml, part);
    while let Some(node) = walker.next_node()? {
        if let Node::Open { name, .. } = node {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// Every text of `xml` under elements named `local` (e.g. all `t` of a comments part),
/// one string per element, whitespace collapsed.
pub(crate) fn texts_of(xml: &str, part: &str, local: &str) -> Result<Vec<String>, ParseError> {
    let mut walker = XmlWalker::new(xml, part);
    let mut texts = Vec::new();
    let mut depth = 0usize;
    let mut current = String::new();
    while let Some(node) = walker.next_node()? {
        match node {
            node if node.is_open(local) => depth += 1,
            node if node.is_close(local) => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    let text = collapse(&current);
                    if !text.is_empty() {
                        texts.push(text);
                    }
                    current.clear();
                }
            }
            Node::Text(text) if depth > 0 => current.push_str(&text),
            _ => {}
        }
    }
    Ok(texts)
}

/// Runs of whitespace become one space; the ends are trimmed.
pub(crate) fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
