//! The RNIC options shared by `rnicd` and `rnic-perf`: a TOML file plus overrides.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};

use clap::Args;
use dataplane::config::{RawConfig, RnicConfig};

/// `--config FILE` and the overrides `--port`, `--ip`, `--mac`, `--eal`, `--set key=value`.
#[derive(Debug, Clone, Default, Args)]
pub struct RnicOpts {
    /// The rnicd TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Port: DPDK vdev devargs (e.g. net_af_packet0,iface=tap0) or a PCI address.
    #[arg(long, value_name = "DEVARGS")]
    pub port: Option<String>,
    /// IPv4 or IPv6 address with prefix length (repeat for more).
    #[arg(long, value_name = "ADDR/LEN")]
    pub ip: Vec<String>,
    /// MAC address to use.
    #[arg(long, value_name = "MAC")]
    pub mac: Option<String>,
    /// EAL arguments, quoted (replace the defaults).
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub eal: Option<String>,
    /// Any configuration key, e.g. --set roce.dscp=26 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl RnicOpts {
    /// The raw configuration: the file (if any) with the overrides applied.
    pub fn raw(&self) -> Result<RawConfig, String> {
        let mut raw = match &self.config {
            Some(p) => RawConfig::load(p).map_err(|e| e.to_string())?,
            None => RawConfig::default(),
        };
        if let Some(p) = &self.port {
            if p.parse::<u16>().is_ok() {
                return Err(format!(
                    "--port {p}: --port names the DPDK port (vdev devargs or a PCI address); \
                     perftest's TCP port is -p/--tcp-port here"
                ));
            }
            raw.set("port.device", p).map_err(|e| e.to_string())?;
        }
        let (v6, v4): (Vec<&String>, Vec<&String>) = self.ip.iter().partition(|s| s.contains(':'));
        if !v4.is_empty() {
            let joined: Vec<&str> = v4.iter().map(|s| s.as_str()).collect();
            raw.set("address.ipv4", &joined.join(","))
                .map_err(|e| e.to_string())?;
        }
        if !v6.is_empty() {
            let joined: Vec<&str> = v6.iter().map(|s| s.as_str()).collect();
            raw.set("address.ipv6", &joined.join(","))
                .map_err(|e| e.to_string())?;
        }
        if let Some(m) = &self.mac {
            raw.set("address.mac", m).map_err(|e| e.to_string())?;
        }
        self.apply_overrides(&mut raw)?;
        Ok(raw)
    }

    /// Applies `--eal` and every `--set key=value` to `raw` (also used for the loopback pair,
    /// whose addresses are fixed).
    pub fn apply_overrides(&self, raw: &mut RawConfig) -> Result<(), String> {
        if let Some(e) = &self.eal {
            raw.set("eal.args", e).map_err(|e| e.to_string())?;
        }
        for kv in &self.set {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("--set {kv:?}: expected KEY=VALUE"))?;
            raw.set(k.trim(), v.trim()).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Whether any RNIC option was given.
    pub fn any(&self) -> bool {
        self.config.is_some()
            || self.port.is_some()
            || !self.ip.is_empty()
            || self.mac.is_some()
            || self.eal.is_some()
            || !self.set.is_empty()
    }

    /// The validated configuration.
    pub fn validate(&self) -> Result<RnicConfig, String> {
        self.raw()?.validate().map_err(|e| e.to_string())
    }
}

static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// Installs SIGINT/SIGTERM handlers that record the signal ([`stop_requested`],
/// [`stop_signal`]). Without SA_RESTART: a blocking system call returns EINTR, so waits
/// notice the request.
pub fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the
    // sigaction structure is zero-initialised and then filled in.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

/// Whether SIGINT/SIGTERM arrived.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst) != 0
}

/// The signal that asked to stop, if any.
pub fn stop_signal() -> Option<i32> {
    match STOP.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The exit code for a run stopped by `sig` (shells use 128 + signal: 130 SIGINT, 143
/// SIGTERM).
pub fn signal_exit_code(sig: i32) -> u8 {
    (128 + sig).clamp(0, 255) as u8
}

/// The name of a stop signal.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// Structured logs to stderr (`RUST_LOG` filters; `default` applies without it, e.g.
/// "warn,dataplane=info").
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only for a terminal: logs piped to a file or a CI log stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

/// `--switch-*` (rnic-perf and rnicd): with `--loopback`, the two RNICs meet in an emulated
/// switch on DPDK (`dataplane::switch`) instead of a bare ring link.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SwitchOpts {
    /// With --loopback: join the two RNICs through an emulated switch whose port links run at
    /// MBPS Mb/s (shaped in real time, shared buffer, ETS classes).
    #[arg(long, value_name = "MBPS")]
    pub switch_mbps: Option<f64>,
    /// The server RNIC's port at this rate instead (the bottleneck of WRITE and SEND tests,
    /// whose data goes to the server).
    #[arg(long, value_name = "MBPS")]
    pub switch_server_mbps: Option<f64>,
    /// Propagation delay on every switch egress, us.
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub switch_delay_us: u32,
    /// ECN marking at the switch: KMIN_KB,KMAX_KB,PMAX (RED on the bytes queued; KB here
    /// are 1000 bytes, as in the DCQCN paper's settings; the configuration file's
    /// `switch.ecn_kmin_kb` / `ecn_kmax_kb` are KiB).
    #[arg(long, value_name = "KMIN,KMAX,PMAX")]
    pub switch_ecn: Option<String>,
    /// PFC at the switch on this priority (XOFF 64 KB per ingress port), honoured by both
    /// RNICs (their pfc.mode/pfc.priorities are set to match).
    #[arg(long, value_name = "PRIO")]
    pub switch_pfc: Option<u8>,
    /// Capture every frame the switch sends (data, ACKs, CNPs, PFC; CE marks as they left).
    #[arg(long, value_name = "FILE")]
    pub switch_pcap: Option<PathBuf>,
}

impl SwitchOpts {
    /// Whether any `--switch-*` option was given.
    pub fn asked(&self) -> bool {
        self.switch_mbps.is_some()
            || self.switch_server_mbps.is_some()
            || self.switch_ecn.is_some()
            || self.switch_pfc.is_some()
            || self.switch_pcap.is_some()
            || self.switch_delay_us > 0
    }

    /// The switch, if asked for.
    pub fn settings(&self) -> Result<Option<dataplane::switch::SwitchSettings>, String> {
        let Some(mbps) = self.switch_mbps else {
            if self.asked() {
                return Err("the --switch-* options need --switch-mbps".into());
            }
            return Ok(None);
        };
        let rate = |r: f64, what: &str| {
            if (1.0..=400_000.0).contains(&r) {
                Ok(r)
            } else {
                Err(format!("{what} {r}: 1..=400000 Mb/s"))
            }
        };
        let mbps = rate(mbps, "--switch-mbps")?;
        let server = rate(
            self.switch_server_mbps.unwrap_or(mbps),
            "--switch-server-mbps",
        )?;
        if self.switch_delay_us > 10_000_000 {
            return Err(format!(
                "--switch-delay-us {}: at most 10 s",
                self.switch_delay_us
            ));
        }
        let red = match &self.switch_ecn {
            None => None,
            Some(s) => {
                let v: Vec<&str> = s.split(',').map(str::trim).collect();
                let bad = || format!("--switch-ecn {s:?}: KMIN_KB,KMAX_KB,PMAX, e.g. 20,200,0.2");
                let [kmin, kmax, pmax] = v.as_slice() else {
                    return Err(bad());
                };
                let kmin: f64 = kmin.parse().map_err(|_| bad())?;
                let kmax: f64 = kmax.parse().map_err(|_| bad())?;
                let pmax: f64 = pmax.parse().map_err(|_| bad())?;
                if !(0.0..=1e6).contains(&kmin)
                    || !(kmin..=1e6).contains(&kmax)
                    || !(0.0..=1.0).contains(&pmax)
                {
                    return Err(bad());
                }
                Some(dcb::ecn::Red {
                    kmin: (kmin * 1000.0) as u64,
                    kmax: (kmax * 1000.0) as u64,
                    pmax,
                })
            }
        };
        let pfc = match self.switch_pfc {
            None => dcb::pfc::Mode::Off,
            Some(p) if p < 8 => dcb::pfc::Mode::Pfc { enabled: 1 << p },
            Some(p) => return Err(format!("--switch-pfc {p}: a priority, 0..=7")),
        };
        Ok(Some(dataplane::switch::SwitchSettings {
            rate_mbps: mbps,
            // Port 0 is the server's RNIC (ferroce0), port 1 the client's.
            port_mbps: vec![server, mbps],
            delay_us: self.switch_delay_us,
            red,
            pfc,
            thresholds: dcb::pfc::Thresholds {
                xoff: 64_000,
                xon: 64_000 - 2 * 4200,
            },
            // What may still arrive after an XOFF: the link's ring and a burst of the RNIC's
            // (48 frames of up to 4 KiB), and the frames read while the XOFF is on its way.
            headroom: 512 << 10,
            pcap: self.switch_pcap.clone(),
            ..Default::default()
        }))
    }
}
