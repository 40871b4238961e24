//! `include/tierkit.h` is what cbindgen generates from this crate. Regenerate it with
//! `TIERKIT_BLESS=1 cargo test -p tierkit-c --test header`.

#[test]
fn committed_header_is_up_to_date() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_src(format!("{dir}/src/lib.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen parses the crate")
        .write(&mut generated);
    let path = format!("{dir}/include/tierkit.h");
    if std::env::var_os("TIERKIT_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{path} is stale: run `TIERKIT_BLESS=1 cargo test -p tierkit-c --test header` and commit it"
    );
}
