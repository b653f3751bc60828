//! The RNIC options shared by `rnicd` and `rnic-perf`: a TOML file plus overrides.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

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

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs SIGINT/SIGTERM handlers that set a flag ([`stop_requested`]).
pub fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Whether SIGINT/SIGTERM arrived.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Structured logs to stderr (`RUST_LOG` filters; `default` applies without it, e.g.
/// "warn,dataplane=info").
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
