//! The Debian package (issue 21): `packaging/build-deb` packages the binary under test, the
//! package installs with `dpkg -i`, and from the installed files alone `fence` works on a
//! directory store, `man -w fence` finds the page and the bash completion completes; then
//! `dpkg -r` removes it all. Installing needs root (as in CI); as another user the test says
//! so and checks only that the package builds and holds the expected files.

use std::process::Command;

fn sh(script: &str) -> std::process::Output {
    Command::new("bash")
        .args(["-c", script])
        .env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
        .output()
        .unwrap()
}

#[test]
fn the_debian_package_installs_works_and_removes() {
    let out_dir = tempfile::tempdir().unwrap();
    let built = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/build-deb"))
        .args(["--fast", "--binary", env!("CARGO_BIN_EXE_fence"), "--out"])
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(built.status.success(), "{built:?}");
    let deb = String::from_utf8(built.stdout).unwrap().trim().to_owned();
    let listing = sh(&format!("dpkg-deb -c '{deb}'"));
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    for path in [
        "./usr/bin/fence",
        "./usr/share/man/man1/fence.1.gz",
        "./usr/share/man/man1/fence-run.1.gz",
        "./usr/share/bash-completion/completions/fence",
        "./usr/share/zsh/vendor-completions/_fence",
        "./usr/share/fish/vendor_completions.d/fence.fish",
        "./usr/share/doc/fence/README.md",
        "./usr/share/doc/fence/copyright",
    ] {
        assert!(
            listing.contains(path),
            "{path} missing from the package:\n{listing}"
        );
    }
    // The guides and the design, beside the README as in the repository, so its links resolve.
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/docs")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            let path = format!("./usr/share/doc/fence/docs/{name}");
            assert!(
                listing.contains(&path),
                "{path} missing from the package:\n{listing}"
            );
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the package was built and checked, not installed");
        return;
    }
    let installed = sh(&format!("dpkg -i '{deb}'"));
    assert!(installed.status.success(), "{installed:?}");
    let store = tempfile::tempdir().unwrap();
    let used = sh(&format!(
        "set -e
         test \"$(command -v fence)\" = /usr/bin/fence
         fence --version
         fence --store file://{store} acquire pkg --owner deb --format json
         fence --store file://{store} release pkg --owner deb --token 1
         man -w fence
         source /usr/share/bash-completion/completions/fence
         complete -p fence",
        store = store.path().display()
    ));
    // The package holds the very binary it was given (the repository's build): the same
    // bytes, so the same performance.
    let same = Command::new("cmp")
        .args(["/usr/bin/fence", env!("CARGO_BIN_EXE_fence")])
        .status()
        .unwrap();
    let removed = sh("dpkg -r fence");
    assert!(
        same.success(),
        "the installed binary differs from the one packaged"
    );
    assert!(used.status.success(), "{used:?}");
    let text = String::from_utf8_lossy(&used.stdout);
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
    assert!(text.contains("\"token\":1"), "{text}");
    assert!(text.contains("/usr/share/man/man1/fence.1.gz"), "{text}");
    assert!(text.contains("-F _fence fence"), "{text}");
    assert!(removed.status.success(), "{removed:?}");
    assert!(!std::path::Path::new("/usr/bin/fence").exists());
}
