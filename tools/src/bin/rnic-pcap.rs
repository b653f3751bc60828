//! rnic-pcap: look at RoCEv2 captures the way ferroce parses them.
//!
//! * `rnic-pcap decode FILE [--json]`: one line (or one JSON object) per frame; ARP, ICMP,
//!   ICMPv6/ND, TCP and UDP are named too. FILE `-` reads standard input.
//! * `rnic-pcap verify FILE`: exit status 1 if any RoCE frame is malformed or fails its ICRC.
//! * `rnic-pcap gen FILE`: sample frames of every opcode (IPv4, IPv6, VLAN) for Wireshark.
//!
//! Reads pcap and pcapng with Ethernet link type.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferroce_tools::pcap_tool;

#[derive(Parser)]
#[command(
    name = "rnic-pcap",
    version,
    about = "Decode, verify and generate RoCEv2 captures"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print one line per frame (or one JSON object per line with --json).
    Decode {
        /// A pcap or pcapng file (`-`: standard input).
        file: PathBuf,
        /// JSON output, one object per frame.
        #[arg(long)]
        json: bool,
    },
    /// Check every RoCE frame (structure and ICRC); exit 1 if any is bad.
    Verify {
        /// A pcap or pcapng file (`-`: standard input).
        file: PathBuf,
    },
    /// Write sample frames of every opcode (IPv4, IPv6, VLAN), PFC, PAUSE and ARP.
    Gen {
        /// The pcap file to write.
        file: PathBuf,
    },
}

/// The capture's bytes: the file, or standard input for `-` (e.g. `tcpdump -w - | rnic-pcap
/// decode -`).
fn read(file: &PathBuf) -> Result<Vec<u8>, String> {
    if file.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        return Ok(v);
    }
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.cmd {
        Cmd::Decode { file, json } => {
            let data = read(&file)?;
            let reader =
                roce::pcap::Reader::new(&data).map_err(|e| format!("{}: {e}", file.display()))?;
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            for (i, rec) in reader.enumerate() {
                let rec = rec.map_err(|e| format!("{}: {e}", file.display()))?;
                let v = pcap_tool::decode_json(i + 1, rec.data);
                let line = if json {
                    v.to_string()
                } else {
                    pcap_tool::decode_line(&v)
                };
                if writeln!(out, "{line}").is_err() {
                    return Ok(ExitCode::SUCCESS); // reader went away (e.g. `| head`)
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Verify { file } => {
            let data = read(&file)?;
            let s = pcap_tool::verify(&data).map_err(|e| format!("{}: {e}", file.display()))?;
            println!("{}", s.line());
            Ok(if s.bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Cmd::Gen { file } => {
            let frames = pcap_tool::gen_frames();
            pcap_tool::write_pcap(&file, &frames)
                .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
            println!("wrote {} frames to {}", frames.len(), file.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    // Output piped into `head` and the like: end quietly when the reader goes.
    // SAFETY: resetting a signal's disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    ferroce_tools::docgen::maybe_generate::<Cli>("rnic-pcap");
    match run(Cli::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rnic-pcap: {e}");
            ExitCode::from(2)
        }
    }
}
