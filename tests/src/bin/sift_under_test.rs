//! The real `sift` command line, built inside the test crate so that integration tests can
//! start it as a separate process (and kill it with SIGKILL).

fn main() -> std::process::ExitCode {
    sift_node::main_entry()
}
