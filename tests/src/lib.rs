//! Integration tests of the Sift node; see tests/tests/.
