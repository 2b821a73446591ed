//! The README names every setting the code reads: each `SIFT_*` environment variable (and any
//! other variable read by name), each config file key and each flag of `sift serve`.
//!
//! Config keys come from the config file's own serde types: a deserializer that records the
//! fields serde asks for walks [`FileConfig`] and everything nested in it, so a new field
//! anywhere under it is a new key here. Keys are written as dotted paths: a field of an array
//! of tables (`[[llm.providers]]`) is `llm.providers.priority`, a field under a table of
//! tables keyed by a chosen name (`[rerank.NAME]`) is `rerank.NAME.base_url`. The README must
//! name each one in backticks.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use serde::Deserialize;
use serde::de::value::{BorrowedStrDeserializer, Error as RecordError};
use serde::de::{self, DeserializeSeed, Visitor};
use sift_node::cli::Cli;
use sift_node::config::FileConfig;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the node crate sits in the workspace root")
        .to_path_buf()
}

fn readme() -> String {
    let path = workspace_root().join("README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("reading {path:?}: {error}"))
}

/// Every `.rs` file of the workspace, outside build output and hidden folders.
fn rust_sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|error| panic!("reading {dir:?}: {error}"));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_sources(&path, found);
            }
        } else if name.ends_with(".rs") {
            found.push(path);
        }
    }
}

fn is_env_name_char(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
}

/// Environment variable names in one source text: every string literal that is a whole
/// `SIFT_*` name, and every name passed as a literal to `env::var`, `env::var_os` or
/// `env::remove_var`/`set_var`.
fn env_names_in(text: &str, names: &mut BTreeSet<String>) {
    for (start, _) in text.match_indices("\"SIFT_") {
        let rest = &text[start + 1..];
        let end = rest
            .find(|c: char| !is_env_name_char(c))
            .unwrap_or(rest.len());
        if end > "SIFT_".len() && rest[end..].starts_with('"') {
            names.insert(rest[..end].to_string());
        }
    }
    for call in ["var(\"", "var_os(\""] {
        for (start, _) in text.match_indices(call) {
            let rest = &text[start + call.len()..];
            let end = rest
                .find(|c: char| !is_env_name_char(c))
                .unwrap_or(rest.len());
            if end > 0 && rest[end..].starts_with('"') {
                names.insert(rest[..end].to_string());
            }
        }
    }
}

fn env_names_in_workspace() -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_sources(&workspace_root(), &mut files);
    let mut names = BTreeSet::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {file:?}: {e}"));
        env_names_in(&text, &mut names);
    }
    names
}

/// `needle` occurs in `haystack` with neither neighbour continuing the name.
fn names_whole(haystack: &str, needle: &str, continues: fn(char) -> bool) -> bool {
    haystack.match_indices(needle).any(|(start, _)| {
        let before = haystack[..start].chars().next_back();
        let after = haystack[start + needle.len()..].chars().next();
        !before.is_some_and(continues) && !after.is_some_and(continues)
    })
}

// A deserializer that builds any serde type out of nothing, recording the path of every
// struct field serde asks for on the way. An `Option` is walked as `Some`, a sequence as one
// element, a map as one entry keyed `NAME`, an enum as its first variant.

#[derive(Clone, Copy)]
struct Recorder<'a> {
    path: &'a str,
    keys: &'a RefCell<BTreeSet<String>>,
}

impl<'a> Recorder<'a> {
    fn child(self, path: &'a str) -> Recorder<'a> {
        Recorder {
            path,
            keys: self.keys,
        }
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

macro_rules! record_as {
    ($($method:ident => $visit:ident($($value:expr)?)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RecordError> {
            visitor.$visit($($value)?)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Recorder<'_> {
    type Error = RecordError;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, RecordError> {
        Err(de::Error::custom(format!(
            "{}: a self-describing type; this test cannot list its keys",
            self.path
        )))
    }

    record_as! {
        deserialize_bool => visit_bool(false),
        deserialize_i8 => visit_u64(0),
        deserialize_i16 => visit_u64(0),
        deserialize_i32 => visit_u64(0),
        deserialize_i64 => visit_u64(0),
        deserialize_u8 => visit_u64(0),
        deserialize_u16 => visit_u64(0),
        deserialize_u32 => visit_u64(0),
        deserialize_u64 => visit_u64(0),
        deserialize_f32 => visit_f64(0.0),
        deserialize_f64 => visit_f64(0.0),
        deserialize_char => visit_char('x'),
        deserialize_str => visit_str("x"),
        deserialize_string => visit_str("x"),
        deserialize_identifier => visit_str("x"),
        deserialize_bytes => visit_bytes(b"x"),
        deserialize_byte_buf => visit_bytes(b"x"),
        deserialize_unit => visit_unit(),
        deserialize_ignored_any => visit_unit(),
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RecordError> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, RecordError> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, RecordError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RecordError> {
        visitor.visit_seq(Elements {
            recorder: self,
            left: 1,
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, RecordError> {
        visitor.visit_seq(Elements {
            recorder: self,
            left: len,
        })
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, RecordError> {
        self.deserialize_tuple(len, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RecordError> {
        let path = join(self.path, "NAME");
        visitor.visit_map(NamedEntry {
            recorder: self,
            path: &path,
            done: false,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RecordError> {
        let paths: Vec<String> = fields.iter().map(|field| join(self.path, field)).collect();
        self.keys.borrow_mut().extend(paths.iter().cloned());
        visitor.visit_map(Fields {
            recorder: self,
            fields,
            paths: &paths,
            next: 0,
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RecordError> {
        visitor.visit_enum(FirstVariant {
            recorder: self,
            variant: variants.first().copied().unwrap_or_default(),
        })
    }
}

struct Elements<'a> {
    recorder: Recorder<'a>,
    left: usize,
}

impl<'de> de::SeqAccess<'de> for Elements<'_> {
    type Error = RecordError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, RecordError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(self.recorder).map(Some)
    }
}

struct NamedEntry<'a> {
    recorder: Recorder<'a>,
    path: &'a str,
    done: bool,
}

impl<'de> de::MapAccess<'de> for NamedEntry<'_> {
    type Error = RecordError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, RecordError> {
        if self.done {
            return Ok(None);
        }
        self.done = true;
        seed.deserialize(BorrowedStrDeserializer::new("NAME"))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, RecordError> {
        seed.deserialize(self.recorder.child(self.path))
    }
}

struct Fields<'a> {
    recorder: Recorder<'a>,
    fields: &'static [&'static str],
    paths: &'a [String],
    next: usize,
}

impl<'de> de::MapAccess<'de> for Fields<'_> {
    type Error = RecordError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, RecordError> {
        match self.fields.get(self.next) {
            Some(field) => seed
                .deserialize(BorrowedStrDeserializer::new(field))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, RecordError> {
        let path = &self.paths[self.next];
        self.next += 1;
        seed.deserialize(self.recorder.child(path))
    }
}

struct FirstVariant<'a> {
    recorder: Recorder<'a>,
    variant: &'static str,
}

impl<'de, 'a> de::EnumAccess<'de> for FirstVariant<'a> {
    type Error = RecordError;
    type Variant = Recorder<'a>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Recorder<'a>), RecordError> {
        let variant =
            seed.deserialize(BorrowedStrDeserializer::<RecordError>::new(self.variant))?;
        Ok((variant, self.recorder))
    }
}

impl<'de> de::VariantAccess<'de> for Recorder<'_> {
    type Error = RecordError;

    fn unit_variant(self) -> Result<(), RecordError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, RecordError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, RecordError> {
        de::Deserializer::deserialize_tuple(self, len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RecordError> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

/// The config file's keys, tables left out (a key with keys under it is a table).
fn config_keys() -> BTreeSet<String> {
    let keys = RefCell::new(BTreeSet::new());
    FileConfig::deserialize(Recorder {
        path: "",
        keys: &keys,
    })
    .expect("every config type can be walked");
    let all = keys.into_inner();
    all.iter()
        .filter(|key| {
            let prefix = format!("{key}.");
            !all.iter().any(|other| other.starts_with(&prefix))
        })
        .cloned()
        .collect()
}

/// `--flag`s of `sift serve`, and the global ones.
fn serve_flags() -> BTreeSet<String> {
    let command = Cli::command();
    let serve = command
        .find_subcommand("serve")
        .expect("`sift serve` exists");
    command
        .get_arguments()
        .filter(|argument| argument.is_global_set())
        .chain(serve.get_arguments())
        .filter_map(|argument| argument.get_long())
        .filter(|long| !matches!(*long, "help" | "version"))
        .map(|long| format!("--{long}"))
        .collect()
}

#[test]
fn the_readme_names_every_environment_variable_the_code_reads() {
    let names = env_names_in_workspace();
    // The scan itself must work: these are read in node/src/config.rs and the LLM config.
    for known in [
        "SIFT_DATA_DIR",
        "SIFT_LLM_BASE_URL",
        "SIFT_NODE",
        "RUST_LOG",
    ] {
        assert!(
            names.contains(known),
            "the source scan missed {known}: {names:?}"
        );
    }
    let readme = readme();
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !names_whole(&readme, name, is_env_name_char))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not name these environment variables the code reads: {missing:?}"
    );
}

#[test]
fn the_readme_names_every_config_file_key() {
    let keys = config_keys();
    for known in [
        "data_dir",
        "runs.max_concurrent",
        "embedding.remote.NAME.base_url",
        "llm.providers.priority",
        "agents.budget.max_iterations",
    ] {
        assert!(
            keys.contains(known),
            "the key walk missed {known}: {keys:?}"
        );
    }
    let readme = readme();
    let missing: Vec<&String> = keys
        .iter()
        .filter(|key| !readme.contains(&format!("`{key}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not name these config keys (in backticks, as dotted paths): {missing:?}"
    );
}

#[test]
fn the_readme_names_every_flag_of_sift_serve() {
    let flags = serve_flags();
    assert!(
        flags.contains("--data-dir") && flags.contains("--node"),
        "{flags:?}"
    );
    let readme = readme();
    let continues_flag = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let missing: Vec<&String> = flags
        .iter()
        .filter(|flag| !names_whole(&readme, flag, continues_flag))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not name these flags of `sift serve`: {missing:?}"
    );
}
