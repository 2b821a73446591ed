//! Unit tests of the Office and EPUB converters.
