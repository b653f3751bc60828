//! In-process clients: an application that runs the RNIC in its own process (rnic-perf
//! without `--rnicd`, the tests) uses the same [`Client`] as a remote one, with its control
//! calls carried to the worker by a [`LocalChannel`] over the runtime's control queue.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use ferroce_host::abi::area::Area;
use ferroce_host::abi::{ClientLimits, Command, HostLimits, ReplyData};
use ferroce_host::app::{Channel, Client};
use roce::engine::{VerbsError, VerbsResult};

use crate::host::{host_end, HostEnd};
use crate::worker::Control;

/// A client in the same process as the worker: control calls go through the runtime's
/// control queue and wait for the worker's reply.
pub struct LocalChannel {
    control: Arc<SegQueue<Control>>,
    nic: usize,
    token: u64,
    alive: Arc<AtomicBool>,
}

impl LocalChannel {
    /// A channel to the host `token` of RNIC `nic`.
    pub fn new(
        control: Arc<SegQueue<Control>>,
        nic: usize,
        token: u64,
        alive: Arc<AtomicBool>,
    ) -> Self {
        LocalChannel {
            control,
            nic,
            token,
            alive,
        }
    }

    /// The token of the host end this channel calls.
    pub fn token(&self) -> u64 {
        self.token
    }

    fn wait(
        &self,
        cmd: Command,
        area: Option<Arc<Area>>,
        deadline: Option<Instant>,
    ) -> VerbsResult<ReplyData> {
        if !self.alive() {
            return Err(VerbsError::DeviceFatal);
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.control.push(Control::Call {
            nic: self.nic,
            token: self.token,
            cmd,
            area,
            reply: tx,
        });
        loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(r) => return r,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(VerbsError::DeviceFatal),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if !self.alive() || deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(VerbsError::DeviceFatal);
                    }
                }
            }
        }
    }
}

impl Channel for LocalChannel {
    fn call(&mut self, cmd: Command, area: Option<Arc<Area>>) -> VerbsResult<ReplyData> {
        self.wait(cmd, area, None)
    }

    fn call_until(&mut self, cmd: Command, deadline: Instant) -> VerbsResult<ReplyData> {
        self.wait(cmd, None, Some(deadline))
    }

    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

/// An application's handle on an RNIC in the same process (the in-process backend).
pub type Context = Client<LocalChannel>;

/// Creates both ends of an in-process client on RNIC `nic` of a worker fed by `control`:
/// the client and the host end to attach to the RNIC (`Nic::add_host`).
pub fn context(
    control: Arc<SegQueue<Control>>,
    nic: usize,
    limits: HostLimits,
    alive: Arc<AtomicBool>,
) -> std::io::Result<(Context, HostEnd)> {
    let (rings, host) = host_end(limits, ClientLimits::default(), "ferroce")?;
    let chan = LocalChannel::new(control, nic, host.token, alive);
    Ok((Client::attach(chan, rings, limits), host))
}
