//! rnicd's configuration (`dataplane::config`): a TOML file and `key=value` overrides, as an
//! operator or a script writes them. The input is TOML text, then after a NUL byte one
//! override per line.
//!
//! Invariants checked: nothing panics (a bad file or override is an error naming its key); a
//! configuration that validates prints (`RnicConfig::to_toml`, `rnicd --print-config`) as
//! TOML that parses and validates to the same configuration.

use dataplane::config::RawConfig;

/// Runs one input (see the module's doc); returns whether its configuration validated.
pub fn run(data: &[u8]) -> bool {
    let (text, sets) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return false;
    };
    let Ok(mut raw) = RawConfig::parse(text) else {
        return false;
    };
    for line in String::from_utf8_lossy(sets).lines() {
        if let Some((k, v)) = line.split_once('=') {
            let _ = raw.set(k, v);
        }
    }
    let Ok(c) = raw.validate() else {
        return false;
    };
    let printed = c.to_toml();
    let again = RawConfig::parse(&printed)
        .and_then(|r| r.validate())
        .unwrap_or_else(|e| panic!("the printed configuration is refused: {e}\n{printed}"));
    assert_eq!(again, c, "printed and parsed back\n{printed}");
    true
}
