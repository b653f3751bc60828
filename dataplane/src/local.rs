//! In-process clients: an application that runs the RNIC in its own process (rnic-perf
//! without `--rnicd`, the tests) uses the same [`Client`] as a remote one, with its control
//! calls carried to the worker by a [`LocalChannel`] over the runtime's control queue. Such
//! a client also runs the worker itself while it waits (an empty CQ, a call's reply):
//! run-to-completion, with no thread hop ([`WorkerCell`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ferroce_host::abi::area::Area;
use ferroce_host::abi::{ClientLimits, Command, HostLimits, ReplyData};
use ferroce_host::app::{Channel, Client};
use roce::engine::{VerbsError, VerbsResult};

use crate::host::{host_end, HostEnd};
use crate::worker::{Control, WorkerCell};

/// A client in the same process as the worker: control calls go through the runtime's
/// control queue and wait for the worker's reply.
pub struct LocalChannel {
    control: crate::worker::ControlQueue,
    nic: usize,
    token: u64,
    alive: Arc<AtomicBool>,
    /// The worker, to run while waiting (None: only its own thread runs it, as for rnicd's
    /// connection threads relaying remote clients' calls).
    cell: Option<Arc<WorkerCell>>,
}

impl LocalChannel {
    /// A channel to the host `token` of RNIC `nic`; with `cell`, the caller runs the worker
    /// while it waits.
    pub fn new(
        control: crate::worker::ControlQueue,
        nic: usize,
        token: u64,
        alive: Arc<AtomicBool>,
        cell: Option<Arc<WorkerCell>>,
    ) -> Self {
        LocalChannel {
            control,
            nic,
            token,
            alive,
            cell,
        }
    }

    /// The token of the host end this channel calls.
    pub fn token(&self) -> u64 {
        self.token
    }
}

impl Channel for LocalChannel {
    fn exchange(
        &mut self,
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
        // Running the worker here answers the call in this thread when nobody else is
        // running it; otherwise wait briefly and try again.
        let slice = match self.cell {
            Some(_) => Duration::from_micros(50),
            None => Duration::from_millis(20),
        };
        loop {
            if let Some(c) = &self.cell {
                c.drive();
            }
            match rx.recv_timeout(slice) {
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

    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    fn progress(&mut self) -> bool {
        let Some(cell) = self.cell.as_ref() else {
            // The worker's own thread does the work (`worker.app_drive = false`).
            return false;
        };
        let worked = cell.drive();
        if !worked {
            // Nothing done: the worker was idle, or another thread is running it. Polling
            // again at once would take its lock in turns with that thread and move the lock's
            // cache line between the cores under it; a pause between tries keeps the in-process
            // half round trip where it was with the pause in rnic-perf's own loop (which
            // through rnicd, where there is no lock, only cost time).
            std::hint::spin_loop();
        }
        worked
    }
}

/// An application's handle on an RNIC in the same process (the in-process backend).
pub type Context = Client<LocalChannel>;

/// Creates both ends of an in-process client on RNIC `nic` of a worker fed by `control`:
/// the client and the host end to attach to the RNIC (`Nic::add_host`). With `cell`, the
/// client runs the worker itself while it waits.
pub fn context(
    control: crate::worker::ControlQueue,
    nic: usize,
    limits: HostLimits,
    alive: Arc<AtomicBool>,
    cell: Option<Arc<WorkerCell>>,
) -> std::io::Result<(Context, HostEnd)> {
    let (rings, host) = host_end(limits, ClientLimits::default(), "ferroce")?;
    let chan = LocalChannel::new(control, nic, host.token, alive, cell);
    Ok((Client::attach(chan, rings, limits), host))
}
