//! Records the commit the binary is built from for `sift_build_info{commit}`: the
//! `SIFT_BUILD_COMMIT` environment variable when set (builds from a tarball, containers),
//! else `git rev-parse`, else "unknown". A build without git never fails because of it.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SIFT_BUILD_COMMIT");
    let commit = std::env::var("SIFT_BUILD_COMMIT")
        .ok()
        .filter(|commit| !commit.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    // Built again when HEAD moves (a checkout, a commit on the branch). Only paths that exist:
    // cargo reruns a build script on every build while a watched path is missing.
    for name in ["HEAD", "logs/HEAD"] {
        if let Some(path) = git(&["rev-parse", "--git-path", name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    // Only characters a Prometheus label value carries as they are.
    let commit: String = commit
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect();
    println!("cargo:rustc-env=SIFT_BUILD_COMMIT={commit}");
}
