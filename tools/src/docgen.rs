//! Man pages and shell completions of the tools, generated from the clap definitions they
//! parse their arguments with, so they cannot drift from the tools: `TOOL --generate-man`
//! prints its man page (roff, section 1), `TOOL --generate-completions bash|zsh|fish` its
//! completion script. `make install` installs both.

use std::io::Write;

use clap::CommandFactory;

/// If the first argument asks for generated documentation, prints it and exits; otherwise
/// returns (the tool then parses its arguments as usual). Called first thing in `main`.
pub fn maybe_generate<C: CommandFactory>(name: &'static str) {
    let mut args = std::env::args().skip(1);
    let Some(first) = args.next() else { return };
    let mut cmd = C::command().name(name);
    let mut out = std::io::stdout();
    match first.as_str() {
        "--generate-man" => {
            let r = clap_mangen::Man::new(cmd).render(&mut out);
            std::process::exit(if r.is_ok() { 0 } else { 1 });
        }
        "--generate-completions" => {
            let shell = match args.next().as_deref() {
                Some("bash") => clap_complete::Shell::Bash,
                Some("zsh") => clap_complete::Shell::Zsh,
                Some("fish") => clap_complete::Shell::Fish,
                other => {
                    eprintln!("{name}: --generate-completions bash|zsh|fish (not {other:?})");
                    std::process::exit(2);
                }
            };
            clap_complete::generate(shell, &mut cmd, name, &mut out);
            let _ = out.flush();
            std::process::exit(0);
        }
        _ => {}
    }
}
