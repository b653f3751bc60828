//! Congestion control on the wire: DCQCN's notification point (CNPs for CE-marked packets) and
//! reaction point (each QP's rate cut on CNPs, raised by its timers and byte counter, and the
//! QP's packets paced to that rate), using the `dcb` crate's sans-IO state machines (ref.
//! dcb.md "DCQCN"; docs/dcb.md "On the wire").
//!
//! A QP carries no congestion state until it needs some: the first CE-marked packet it
//! receives or the first CNP addressed to it allocates a [`QpCc`]. Before its first CNP a QP
//! runs at line rate, as DCQCN has no slow start, so an uncongested QP costs one `Option`
//! test per packet.
//!
//! Pacing gates what carries data (requests and READ responses); ACKs, NAKs and CNPs are never
//! held back, as a hardware rate limiter shapes a QP's data and lets its control packets pass.
//! Alpha is not woken for: its decay between events is applied in closed form when the next
//! event comes ([`dcb::dcqcn::Rp::handle_timeout`] costs O(1) whatever the gap), so a
//! throttled QP wakes the worker only when its rate can change (increase timer, or a
//! monitor period that saw a CNP) or a paced packet may go.

use dcb::dcqcn::{Np, Rp, RpParams, Variant};
use dcb::limiter::Pacer;

/// Bytes a packet occupies on the wire besides its payload, as the pacer counts them: the
/// headers ([`super::transmit::WIRE_HEADERS`]) plus preamble and inter-frame gap (20);
/// extended headers are small and left out.
pub const WIRE_OVERHEAD: u64 = super::transmit::WIRE_HEADERS as u64 + 20;

/// The DSCP NVIDIA NICs send CNPs with (`np_cnp_dscp`, ref. dcb.md).
pub const CNP_DSCP: u8 = 48;
/// The 802.1p priority of CNPs (`np_cnp_prio`, ref. dcb.md).
pub const CNP_PRIO: u8 = 6;

/// A device's congestion control (both ends of DCQCN; either may be off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CongestionConfig {
    /// Reaction point: a QP's rate follows DCQCN on the CNPs it receives and its packets are
    /// paced to it (mlx5 `roce_rp/enable`). `None`: CNPs are counted and otherwise ignored.
    pub rp: Option<RpParams>,
    /// Notification point: a CNP for a CE-marked packet, at most one per QP per this many
    /// nanoseconds (mlx5 `roce_np/enable` and `np_min_time_between_cnps`). `None`: CE marks
    /// are counted only.
    pub np_min_interval_ns: Option<u64>,
    /// DSCP of the CNPs sent (`np_cnp_dscp`); they are never ECN-capable.
    pub cnp_dscp: u8,
    /// 802.1p priority of the CNPs sent (`np_cnp_prio`), as the path's SL.
    pub cnp_prio: u8,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        CongestionConfig {
            rp: None,
            np_min_interval_ns: None,
            cnp_dscp: CNP_DSCP,
            cnp_prio: CNP_PRIO,
        }
    }
}

/// One QP's congestion state, allocated at its first CE mark or CNP.
#[derive(Debug, Clone)]
pub(crate) struct QpCc {
    /// Reaction point (present once a CNP arrived with the RP enabled).
    rp: Option<Rp>,
    /// Paces the QP's data at the RP's rate while it is below line rate.
    pacer: Pacer,
    /// Notification point.
    pub np: Np,
    /// A CNP is owed to the peer.
    pub cnp_pending: bool,
    /// A paced packet waits until then (the QP's timer wakes it).
    pub paced_until: Option<u64>,
}

impl QpCc {
    pub fn new() -> QpCc {
        QpCc {
            rp: None,
            pacer: Pacer::new(f64::MAX, 0),
            np: Np::default(),
            cnp_pending: false,
            paced_until: None,
        }
    }

    /// Whether the QP runs below line rate (its data is paced).
    #[inline]
    fn throttled(&self) -> bool {
        self.rp
            .as_ref()
            .is_some_and(|rp| rp.rate() < rp.params().line_rate)
    }

    /// The QP's current rate, Mb/s, while it is throttled.
    pub fn rate(&self) -> Option<f64> {
        self.rp.as_ref().filter(|_| self.throttled()).map(Rp::rate)
    }

    /// The pacer's burst: two packets of the path MTU (a hardware limiter lets a little
    /// through at once too; zero would lose rate to the worker's wake-up jitter).
    fn burst(mtu: u32) -> u64 {
        2 * (mtu as u64 + WIRE_OVERHEAD)
    }

    /// A CNP arrived for this QP at `now`.
    pub fn on_cnp(&mut self, params: RpParams, now: u64, mtu: u32) {
        let rp = self.rp.get_or_insert_with(|| Rp::new(params, now));
        // The periods that ended before this CNP first (alpha is not woken for, and a CNP
        // belongs to the period it arrives in).
        rp.handle_timeout(now);
        rp.on_cnp(now);
        self.sync_rate(now, mtu);
        // The paper's RP cuts at once; the firmware's at its next monitor period, which
        // `next_deadline` now includes.
    }

    /// Copies the RP's rate into the pacer.
    fn sync_rate(&mut self, now: u64, mtu: u32) {
        if let Some(rp) = &self.rp {
            let r = rp.rate();
            if (r - self.pacer.rate()).abs() > f64::EPSILON * r.max(1.0) {
                self.pacer.set_rate(now, r, Self::burst(mtu));
            }
        }
    }

    /// Whether a data packet may go at `now`; if not, `paced_until` says when.
    #[inline]
    pub fn may_send(&mut self, now: u64) -> bool {
        if !self.throttled() || self.pacer.can_send(now) {
            return true;
        }
        self.paced_until = Some(self.pacer.next_allowed(now));
        false
    }

    /// A data packet with `payload` bytes left at `now`.
    #[inline]
    pub fn on_data_sent(&mut self, now: u64, payload: u64) {
        let Some(rp) = self.rp.as_mut() else {
            return;
        };
        let bytes = payload + WIRE_OVERHEAD;
        rp.on_sent(bytes, now);
        if rp.rate() < rp.params().line_rate {
            self.pacer.on_send(now, bytes);
        }
    }

    /// When the QP must next be woken: a paced packet, or the RP's rate can change.
    pub fn next_deadline(&self) -> Option<u64> {
        let rp = self.rp.as_ref().map_or(u64::MAX, |rp| {
            if rp.rate() >= rp.params().line_rate && rp.target() >= rp.params().line_rate {
                // Back at line rate: nothing left to increase; a cut needs a CNP first
                // (paper) or is due at the monitor period that saw it (firmware).
                match rp.params().variant {
                    Variant::Paper => u64::MAX,
                    Variant::Firmware => rp.next_cut().unwrap_or(u64::MAX),
                }
            } else {
                rp.next_rate_event()
            }
        });
        let t = rp.min(self.paced_until.unwrap_or(u64::MAX));
        (t != u64::MAX).then_some(t)
    }

    /// Runs what is due at `now`.
    pub fn on_timer(&mut self, now: u64, mtu: u32) {
        if self.paced_until.is_some_and(|t| t <= now) {
            self.paced_until = None;
        }
        if let Some(rp) = self.rp.as_mut() {
            rp.handle_timeout(now);
        }
        self.sync_rate(now, mtu);
    }
}
