//! `sift`: one binary for every node and the command-line client.

fn main() -> std::process::ExitCode {
    sift_node::main_entry()
}
