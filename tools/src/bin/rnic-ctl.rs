//! rnic-ctl: look at a running rnicd as RDMA tools look at a kernel RNIC.
//!
//! - `rnic-ctl dev` - every RNIC like `ibv_devinfo -v`: name, node GUID, limits, port state,
//!   MTUs, speed, GID table;
//! - `rnic-ctl res [qp|cq|mr|pd|srq]` - every object like `rdma resource show`, with its
//!   owner's pid and command name, QP states and PSNs;
//! - `rnic-ctl stat [--qp] [--watch SECS]` - port (and per-QP) counters by the names
//!   `rdma statistic` and mlx5 use;
//! - `rnic-ctl capture DEVICE on|off` - switch an RNIC's pcap capture;
//! - `rnic-ctl sysfs DIR` - write a sysfs-style description of every RNIC under DIR
//!   (`class/infiniband`, `class/infiniband_verbs`), what `ferroce-run` shows programs.
//!
//! `--json` prints every answer as JSON; `--socket` (or FERROCE_SOCKET) names rnicd's socket.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use ferroce_host::abi::proto::{
    AdminRequest, DeviceInfo, DeviceStats, ReplyBody, Resources, STAT_GAUGES,
};
use ferroce_host::app::remote::Admin;
use ferroce_tools::rnic_opts::{install_signal_handlers, stop_requested};

#[derive(Parser)]
#[command(
    name = "rnic-ctl",
    version,
    about = "Inspect and control a running rnicd"
)]
struct Cli {
    /// rnicd's socket (default: $FERROCE_SOCKET or /run/ferroce/rnicd.sock).
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every RNIC, like `ibv_devinfo -v`.
    Dev {
        /// Only this RNIC.
        #[arg(short = 'd', long = "ib-dev")]
        device: Option<String>,
    },
    /// Objects and their owners, like `rdma resource show`.
    Res {
        /// Which objects (default: a summary of all).
        #[arg(value_enum)]
        kind: Option<ResKind>,
    },
    /// Counters, like `rdma statistic show`.
    Stat {
        /// Per-QP counters too.
        #[arg(long)]
        qp: bool,
        /// Print again every SECS seconds (more than 0), with rates, until Ctrl-C.
        #[arg(long, value_name = "SECS", value_parser = positive_secs)]
        watch: Option<f64>,
    },
    /// Switch an RNIC's capture (its capture.pcap) on or off.
    Capture {
        /// The RNIC, e.g. ferroce0.
        device: String,
        /// on or off.
        #[arg(value_enum)]
        state: OnOff,
    },
    /// Write a sysfs-style description of every RNIC under DIR (DIR stands for /sys:
    /// class/infiniband/<name>, class/infiniband_verbs/...), as ferroce-run shows it.
    Sysfs {
        /// The directory (created if missing).
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ResKind {
    Qp,
    Cq,
    Mr,
    Pd,
    Srq,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// A GID as ibv_devinfo prints it: eight groups of four hex digits.
fn gid_text(g: &roce::types::Gid) -> String {
    g.0.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

fn mtu_code(bytes: u32) -> u32 {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

fn print_dev(d: &DeviceInfo) {
    let a = &d.attr;
    let l = &a.limits;
    println!("hca_id:\t{}", d.name);
    println!("\ttransport:\t\t\tInfiniBand (0)");
    println!("\tfw_ver:\t\t\t\t{}", roce::engine::FW_VERSION);
    println!("\tnode_guid:\t\t\t{}", d.node_guid);
    println!("\tsys_image_guid:\t\t\t{}", d.node_guid);
    println!("\tvendor_id:\t\t\t{:#06x}", a.vendor_id);
    println!("\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    println!("\thw_ver:\t\t\t\t0x0");
    println!("\tphys_port_cnt:\t\t\t1");
    println!("\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
    println!("\tmax_qp:\t\t\t\t{}", l.max_qp);
    println!("\tmax_qp_wr:\t\t\t{}", l.max_qp_wr);
    println!("\tmax_sge:\t\t\t{}", l.max_sge);
    println!("\tmax_cq:\t\t\t\t{}", l.max_cq);
    println!("\tmax_cqe:\t\t\t{}", l.max_cqe);
    println!("\tmax_mr:\t\t\t\t{}", l.max_mr);
    println!("\tmax_pd:\t\t\t\t{}", l.max_pd);
    println!("\tmax_qp_rd_atom:\t\t\t{}", l.max_qp_rd_atom);
    println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
    println!(
        "\tatomic_cap:\t\t\t{} ({})",
        if a.atomic_cap == 1 {
            "ATOMIC_HCA"
        } else {
            "ATOMIC_NONE"
        },
        a.atomic_cap
    );
    println!("\tmax_srq:\t\t\t{}", l.max_srq);
    println!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
    println!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
    println!("\tmax_inline_data:\t\t{}", a.max_inline_data);
    println!("\t\tport:\t1");
    println!(
        "\t\t\tstate:\t\t\t{}",
        if d.active {
            "PORT_ACTIVE (4)"
        } else {
            "PORT_DOWN (1)"
        }
    );
    println!("\t\t\tmax_mtu:\t\t{} ({})", d.max_mtu, mtu_code(d.max_mtu));
    println!(
        "\t\t\tactive_mtu:\t\t{} ({})",
        d.active_mtu,
        mtu_code(d.active_mtu)
    );
    println!("\t\t\tsm_lid:\t\t\t0");
    println!("\t\t\tport_lid:\t\t0");
    println!("\t\t\tport_lmc:\t\t0x00");
    println!("\t\t\tlink_layer:\t\tEthernet");
    println!("\t\t\tactive_speed:\t\t{} Gb/s", d.speed_gbps);
    println!("\t\t\tnetdev:\t\t\t{} (mac {})", d.port, d.mac);
    println!("\t\t\tclients:\t\t{}", d.clients);
    for (i, g) in d.gids.iter().enumerate() {
        println!("\t\t\tGID[{i:>3}]:\t\t{}, RoCE v2", gid_text(g));
    }
    println!();
}

/// `--watch`: a positive number of seconds.
fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        Ok(_) => Err("must be more than 0 seconds and at most a day (86400)".into()),
        Err(_) => Err(format!("{s:?} is not a number of seconds")),
    }
}

fn print_res(r: &Resources, kind: Option<ResKind>) {
    let want = |k: ResKind| kind.is_none_or(|x| x == k);
    if r.clients.is_empty() && r.qps.is_empty() && r.objects.is_empty() {
        // Say so: an empty answer looks like a tool that did not work.
        println!("no clients: rnicd holds no objects");
        return;
    }
    if kind.is_none() {
        // `rdma resource show`: a count per device and kind.
        let mut devs: Vec<&String> = r.clients.iter().map(|c| &c.device).collect();
        devs.sort();
        devs.dedup();
        for d in devs {
            let n = |k: &str| {
                r.objects
                    .iter()
                    .filter(|o| o.device == *d && o.kind == k)
                    .count()
            };
            let qps = r.qps.iter().filter(|q| q.device == *d).count();
            println!(
                "{d}: pd {} cq {} qp {qps} mr {} srq {} clients {}",
                n("pd"),
                n("cq"),
                n("mr"),
                n("srq"),
                r.clients.iter().filter(|c| c.device == *d).count()
            );
        }
        for c in &r.clients {
            println!(
                "client {} pid {} uid {} comm {} shared {} bytes",
                c.device, c.pid, c.uid, c.comm, c.area_bytes
            );
        }
        return;
    }
    if want(ResKind::Qp) {
        for q in &r.qps {
            let t = match q.qp_type {
                roce::verbs::QpType::Rc => "RC",
                roce::verbs::QpType::Uc => "UC",
                roce::verbs::QpType::Ud => "UD",
            };
            let mut line = format!("link {}/1 lqpn {}", q.device, q.qpn);
            if let Some(d) = q.dest_qp {
                line += &format!(" rqpn {d}");
            }
            line += &format!(
                " type {t} state {}",
                format!("{:?}", q.state).to_uppercase(),
            );
            // PSNs of another user's QP are not shown (rnicd sends none).
            if let (Some(r), Some(s)) = (q.rq_psn, q.sq_psn) {
                line += &format!(" rq-psn {r} sq-psn {s}");
            }
            if let Some(m) = q.path_mtu {
                line += &format!(" path-mtu {m}");
            }
            if let Some(k) = q.rate_kbps {
                // DCQCN holds the QP below line rate.
                line += &format!(" rate {:.3}Mbps", k as f64 / 1000.0);
            }
            line += &format!(" pid {} comm {}", q.pid, q.comm);
            println!("{line}");
        }
    }
    for (k, name, id) in [
        (ResKind::Cq, "cq", "cqn"),
        (ResKind::Mr, "mr", "mrn"),
        (ResKind::Pd, "pd", "pdn"),
        (ResKind::Srq, "srq", "srqn"),
    ] {
        if !want(k) {
            continue;
        }
        for o in r.objects.iter().filter(|o| o.kind == name) {
            // As `rdma resource show mr`: keys only where rnicd shows them (owner, root).
            let extra = match (name, o.key) {
                ("mr", Some(k)) => format!(" lkey {k:#x} rkey {k:#x} mrlen {}", o.size),
                ("mr", None) => format!(" mrlen {}", o.size),
                _ => String::new(),
            };
            println!(
                "dev {} {id} {}{extra} pid {} comm {}",
                o.device, o.id, o.pid, o.comm
            );
        }
    }
}

/// A count with thousands separators.
fn grouped(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A counter's rate in the unit it reads best in: bytes as bits per second, frames and
/// packets as packets per second, the rest as events per second.
fn human_rate(name: &str, per_sec: f64) -> String {
    let scaled = |v: f64, unit: &str| -> String {
        if v >= 1e9 {
            format!("{:.2} G{unit}", v / 1e9)
        } else if v >= 1e6 {
            format!("{:.2} M{unit}", v / 1e6)
        } else if v >= 1e3 {
            format!("{:.2} k{unit}", v / 1e3)
        } else {
            format!("{v:.0} {unit}")
        }
    };
    if name.ends_with("_bytes") {
        scaled(per_sec * 8.0, "b/s")
    } else if name.contains("frames") || name.contains("pkts") || name.contains("packets") {
        scaled(per_sec, "pps")
    } else {
        scaled(per_sec, "/s")
    }
}

/// One table per RNIC (`link ferroce0/1`) and per QP (`link ferroce0/1 lqpn N`): a line per
/// non-zero counter, its value and, when watching, its rate in human units.
fn print_stats(s: &[DeviceStats], prev: Option<(&[DeviceStats], f64)>) {
    let rate = |dev: &str, qp: Option<u32>, k: &str, v: u64| -> String {
        let Some((p, secs)) = prev else {
            return String::new();
        };
        let old = p.iter().find(|d| d.device == dev).and_then(|d| match qp {
            None => d.port.iter().find(|(n, _)| n == k).map(|x| x.1),
            Some(q) => d
                .qps
                .iter()
                .find(|(n, _)| *n == q)
                .and_then(|(_, c)| c.iter().find(|(n, _)| n == k).map(|x| x.1)),
        });
        match old {
            _ if STAT_GAUGES.contains(&k) => String::new(),
            Some(o) if v >= o && secs > 0.0 => human_rate(k, (v - o) as f64 / secs),
            _ => String::new(),
        }
    };
    let table = |title: String, rows: &[(String, u64)], dev: &str, qp: Option<u32>| {
        println!("{title}");
        let nonzero: Vec<&(String, u64)> = rows.iter().filter(|(_, v)| *v != 0).collect();
        if nonzero.is_empty() {
            println!("  (every counter is 0)");
        }
        for (k, v) in nonzero {
            let r = rate(dev, qp, k, *v);
            let line = format!("  {k:<30} {:>22} {r:>14}", grouped(*v));
            println!("{}", line.trim_end());
        }
    };
    for d in s {
        // The emulated switch is no RDMA link: its name alone; a worker thread with the
        // RNICs it drives.
        let title = if d.device.starts_with("switch") {
            d.device.clone()
        } else if !d.rnics.is_empty() {
            format!("{} ({})", d.device, d.rnics.join(", "))
        } else {
            format!("link {}/1", d.device)
        };
        table(title, &d.port, &d.device, None);
        for (q, c) in &d.qps {
            table(
                format!("link {}/1 lqpn {q}", d.device),
                c,
                &d.device,
                Some(*q),
            );
        }
    }
}

/// Counters as JSON objects (name: value), not the protocol's pairs.
fn stats_json(s: &[DeviceStats]) -> serde_json::Value {
    let obj = |rows: &[(String, u64)]| -> serde_json::Value {
        serde_json::Value::Object(
            rows.iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::from(*v)))
                .collect(),
        )
    };
    serde_json::Value::Array(
        s.iter()
            .map(|d| {
                let mut v = serde_json::json!({
                    "device": d.device,
                    "port": obj(&d.port),
                    "qps": serde_json::Value::Object(
                        d.qps.iter().map(|(q, c)| (q.to_string(), obj(c))).collect()
                    ),
                });
                if !d.rnics.is_empty() {
                    v["rnics"] = serde_json::json!(d.rnics);
                }
                v
            })
            .collect(),
    )
}

/// Devices as JSON, their GIDs in text form.
fn devices_json(devs: &[DeviceInfo]) -> serde_json::Value {
    let mut v = serde_json::to_value(devs).unwrap_or_default();
    if let Some(arr) = v.as_array_mut() {
        for (j, d) in arr.iter_mut().zip(devs) {
            j["gids"] = d.gids.iter().map(gid_text).collect();
        }
    }
    v
}

fn run(cli: &Cli) -> Result<(), String> {
    let mut a = Admin::connect(cli.socket.as_deref()).map_err(|e| e.to_string())?;
    let mut ask = |req: AdminRequest| a.request(req).map_err(|e| e.to_string());
    match &cli.cmd {
        Cmd::Dev { device } => {
            let ReplyBody::Devices(mut devs) = ask(AdminRequest::Devices)? else {
                return Err("unexpected reply".into());
            };
            if let Some(d) = device {
                devs.retain(|x| x.name == *d);
                if devs.is_empty() {
                    return Err(format!("no RNIC {d}"));
                }
            }
            if cli.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&devices_json(&devs)).unwrap_or_default()
                );
            } else {
                devs.iter().for_each(print_dev);
            }
        }
        Cmd::Res { kind } => {
            let ReplyBody::Resources(r) = ask(AdminRequest::Resources)? else {
                return Err("unexpected reply".into());
            };
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
            } else {
                print_res(&r, *kind);
            }
        }
        Cmd::Stat { qp, watch } => {
            let mut prev: Option<(Vec<DeviceStats>, Instant)> = None;
            loop {
                let ReplyBody::Stats(s) = ask(AdminRequest::Stats { qps: *qp })? else {
                    return Err("unexpected reply".into());
                };
                if cli.json {
                    println!(
                        "{}",
                        serde_json::to_string(&stats_json(&s)).unwrap_or_default()
                    );
                } else {
                    let p = prev
                        .as_ref()
                        .map(|(p, t)| (p.as_slice(), t.elapsed().as_secs_f64()));
                    print_stats(&s, p);
                }
                let Some(w) = watch else { break };
                prev = Some((s, Instant::now()));
                let until = Instant::now() + Duration::from_secs_f64(w.max(0.1));
                while Instant::now() < until {
                    if stop_requested() {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                if !cli.json {
                    println!();
                }
            }
        }
        Cmd::Sysfs { dir } => {
            let ReplyBody::Devices(devs) = ask(AdminRequest::Devices)? else {
                return Err("unexpected reply".into());
            };
            ferroce_tools::sysfs::write_tree(dir, &devs)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            if cli.json {
                println!("{{}}");
            }
        }
        Cmd::Capture { device, state } => {
            ask(AdminRequest::Capture {
                device: device.clone(),
                on: *state == OnOff::On,
            })?;
            if !cli.json {
                println!(
                    "{device}: capture {}",
                    if *state == OnOff::On { "on" } else { "off" }
                );
            } else {
                println!("{{}}");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // Output piped into `head` and the like: end quietly when the reader goes (SIGPIPE's
    // default action), as command-line tools do, instead of a panic on EPIPE.
    // SAFETY: resetting a signal's disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    ferroce_tools::docgen::maybe_generate::<Cli>("rnic-ctl");
    let cli = Cli::parse();
    install_signal_handlers();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rnic-ctl: {e}");
            ExitCode::from(1)
        }
    }
}
