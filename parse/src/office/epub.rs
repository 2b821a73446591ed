//! EPUB (2 and 3) -> Markdown, chapter by chapter in reading (spine) order.
//!
//! `META-INF/container.xml` names the package document (OPF); its spine lists the chapters.
//! Each XHTML chapter goes through the HTML converter ([`html_to_markdown`]), so its own
//! headings, lists and tables come out as for any HTML upload. A chapter that does not open
//! with a heading gets one from the table of contents (the EPUB 3 `nav` document, else the
//! EPUB 2 NCX), so every chapter has its place in the heading path.

use std::collections::HashMap;

use super::container::{Container, parent_dir, resolve};
use super::xml::{Node, XmlWalker, collapse};
use super::{OfficeLimits, zip_kind_mismatch};
use crate::parse::{ParseError, SourceFormat, html_to_markdown};

/// Returns the book's title (`dc:title`) and its Markdown.
pub(crate) fn epub_to_markdown(
    bytes: &[u8],
    limits: &OfficeLimits,
) -> Result<(Option<String>, String), ParseError> {
    let mut container = Container::open(bytes, limits)?;
    let Some(manifest_xml) = container.read_text("META-INF/container.xml")? else {
        return Err(zip_kind_mismatch(&container, SourceFormat::Epub));
    };
    let mut walker = XmlWalker::new(&manifest_xml, "META-INF/container.xml");
    let mut package_path = None;
    while let Some(node) = walker.next_node()? {
        if node.is_open("rootfile")
            && let Some(path) = node.attribute("full-path")
        {
            package_path = Some(resolve("", path));
            break;
        }
    }
    let package_path = package_path
        .ok_or_else(|| ParseError::InvalidDocument("the EPUB names no package document".into()))?;
    let package_xml = container
        .read_text(&package_path)?
        .ok_or_else(|| ParseError::InvalidDocument(format!("the EPUB has no {package_path}")))?;
    let package = Package::parse(&package_xml, &package_path)?;
    let toc = table_of_contents(&mut container, &package)?;

    let mut chapters = Vec::new();
    for id in &package.spine {
        let Some(item) = package.items.get(id) else {
            continue;
        };
        if !matches!(
            item.media_type.as_str(),
            "application/xhtml+xml" | "text/html"
        ) {
            continue;
        }
        let Some(xhtml) = container.read_text(&item.path)? else {
            continue;
        };
        let (_, markdown) = html_to_markdown(&xhtml)?;
        let markdown = markdown.trim();
        if markdown.is_empty() {
            continue;
        }
        let opens_with_heading = markdown
            .lines()
            .find(|line| !line.trim().is_empty())
            .is_some_and(|line| line.trim_start().starts_with('#'));
        match toc.get(&item.path) {
            Some(label) if !opens_with_heading => chapters.push(format!("# {label}\n\n{markdown}")),
            _ => chapters.push(markdown.to_string()),
        }
    }
    Ok((package.title, chapters.join("\n\n")))
}

#[derive(Debug)]
struct Item {
    /// The zip path of the item.
    path: String,
    media_type: String,
    properties: String,
}

#[derive(Debug, Default)]
struct Package {
    title: Option<String>,
    /// Manifest id -> item.
    items: HashMap<String, Item>,
    /// Manifest ids in reading order.
    spine: Vec<String>,
    /// The NCX's manifest id (`<spine toc="...">`).
    ncx: Option<String>,
}

impl Package {
    fn parse(xml: &str, path: &str) -> Result<Package, ParseError> {
        let dir = parent_dir(path);
        let mut walker = XmlWalker::new(xml, path);
        let mut package = Package::default();
        let mut in_title = false;
        let mut title = String::new();
        while let Some(node) = walker.next_node()? {
            match &node {
                node if node.is_open("title") && package.title.is_none() => in_title = true,
                node if node.is_close("title") && in_title => {
                    in_title = false;
                    let text = collapse(&title);
                    if !text.is_empty() {
                        package.title = Some(text);
                    }
                }
                Node::Text(text) if in_title => title.push_str(text),
                node if node.is_open("item") => {
                    if let (Some(id), Some(href)) = (node.attribute("id"), node.attribute("href")) {
                        package.items.insert(
                            id.to_string(),
                            Item {
                                path: resolve(dir, href),
                                media_type: node.attribute("media-type").unwrap_or("").to_string(),
                                properties: node.attribute("properties").unwrap_or("").to_string(),
                            },
                        );
                    }
                }
                node if node.is_open("spine") => {
                    package.ncx = node.attribute("toc").map(str::to_string);
                }
                node if node.is_open("itemref") => {
                    if let Some(id) = node.attribute("idref") {
                        package.spine.push(id.to_string());
                    }
                }
                _ => {}
            }
        }
        Ok(package)
    }
}

/// Chapter zip path -> its label in the table of contents (the first one naming it).
fn table_of_contents(
    container: &mut Container<'_>,
    package: &Package,
) -> Result<HashMap<String, String>, ParseError> {
    let mut labels = HashMap::new();
    let nav = package
        .items
        .values()
        .find(|item| item.properties.split_whitespace().any(|p| p == "nav"));
    let ncx = package
        .ncx
        .as_ref()
        .and_then(|id| package.items.get(id))
        .or_else(|| {
            package
                .items
                .values()
                .find(|item| item.media_type == "application/x-dtbncx+xml")
        });
    // (path of the TOC document, element holding a label, attribute or element with the link)
    if let Some(nav) = nav {
        let path = nav.path.clone();
        if let Some(xml) = container.read_text(&path)? {
            let mut walker = XmlWalker::new(&xml, &path);
            let mut link: Option<(String, String)> = None;
            while let Some(node) = walker.next_node()? {
                match &node {
                    node if node.is_open("a") => {
                        link = node
                            .attribute("href")
                            .map(|href| (resolve(parent_dir(&path), href), String::new()));
                    }
                    Node::Text(text) => {
                        if let Some((_, label)) = link.as_mut() {
                            label.push_str(text);
                        }
                    }
                    node if node.is_close("a") => {
                        if let Some((target, label)) = link.take() {
                            add_label(&mut labels, target, &label);
                        }
                    }
                    _ => {}
                }
            }
        }
    } else if let Some(ncx) = ncx {
        let path = ncx.path.clone();
        if let Some(xml) = container.read_text(&path)? {
            let mut walker = XmlWalker::new(&xml, &path);
            let mut in_label = false;
            let mut label = String::new();
            while let Some(node) = walker.next_node()? {
                match &node {
                    node if node.is_open("navLabel") => {
                        in_label = true;
                        label.clear();
                    }
                    node if node.is_close("navLabel") => in_label = false,
                    Node::Text(text) if in_label => label.push_str(text),
                    node if node.is_open("content") => {
                        if let Some(source) = node.attribute("src") {
                            add_label(&mut labels, resolve(parent_dir(&path), source), &label);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(labels)
}

fn add_label(labels: &mut HashMap<String, String>, target: String, label: &str) {
    let label = collapse(label);
    if !label.is_empty() {
        labels.entry(target).or_insert(label);
    }
}
