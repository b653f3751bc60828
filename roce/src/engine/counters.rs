//! Per-QP and per-device counters, named as `rdma statistic` shows them for mlx5 and rxe
//! (reference/perftest.md "Counter names users expect"), plus ferroce's own where neither has
//! one (drop reasons, NAKs by code).

/// Declares a struct of named `u64` counters with `NAMES`, `iter`, `add` and `get` (used for
/// the engine's counters here and for the dataplane's port and neighbour counters).
#[macro_export]
macro_rules! counters {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fm])* pub $field: u64,)*
        }

        impl $name {
            /// Counter names, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// (name, value) pairs in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$((stringify!($field), self.$field)),*].into_iter()
            }

            /// Adds every counter of `o`.
            pub fn add(&mut self, o: &$name) {
                $(self.$field += o.$field;)*
            }

            /// Subtracts every counter of `o` (wrapping: `o` is an earlier snapshot of
            /// counters that only grow, so the result is what they grew by).
            pub fn sub(&mut self, o: &$name) {
                $(self.$field = self.$field.wrapping_sub(o.$field);)*
            }

            /// The value of the counter called `name`.
            pub fn get(&self, name: &str) -> Option<u64> {
                self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
            }
        }
    };
}

counters!(
    /// Counters of one QP.
    QpCounters {
        /// Packets sent (rxe).
        sent_pkts,
        /// Packets received and accepted for processing (rxe).
        rcvd_pkts,
        /// Request packets sent again by go-back-N (ferroce).
        retransmitted_pkts,
        /// SEND requests received (first/only packets).
        rx_send_requests,
        /// RDMA WRITE requests received (mlx5).
        rx_write_requests,
        /// RDMA READ requests received (mlx5).
        rx_read_requests,
        /// ATOMIC requests received (mlx5).
        rx_atomic_requests,
        /// Requests received with a PSN beyond the expected one (mlx5).
        out_of_sequence,
        /// Out-of-sequence requests (rxe's name for the same event).
        out_of_seq_request,
        /// Duplicate requests received (mlx5, rxe).
        duplicate_request,
        /// PSN sequence error NAKs received by the requester (mlx5).
        packet_seq_err,
        /// PSN sequence error NAKs received (rxe).
        rcvd_seq_err,
        /// Local ACK timeouts (mlx5).
        local_ack_timeout_err,
        /// ACK timeouts that cost no retry because the packets were still held for address
        /// resolution (ferroce).
        ack_timeouts_held,
        /// Implied NAKs: a response skipped an outstanding READ/ATOMIC (mlx5).
        implied_nak_seq_err,
        /// Retransmissions started by the completer (rxe).
        completer_retry_err,
        /// WRs failed with RETRY_EXC_ERR (rxe).
        retry_exceeded_err,
        /// RNR NAKs received (rxe).
        rcvd_rnr_err,
        /// RNR NAKs sent (rxe).
        send_rnr_err,
        /// WRs failed with RNR_RETRY_EXC_ERR (mlx5).
        rnr_nak_retry_err,
        /// Remote access error NAKs received by the requester (mlx5).
        req_remote_access_errors,
        /// Remote access errors detected by the responder (mlx5).
        resp_remote_access_errors,
        /// Invalid request NAKs received by the requester (mlx5).
        req_remote_invalid_request,
        /// Invalid requests detected by the responder.
        resp_remote_invalid_request,
        /// Remote operational error NAKs received.
        req_remote_operational_error,
        /// Local length errors at the responder (mlx5).
        resp_local_length_error,
        /// Duplicate READ/ATOMIC requests dropped: no longer among the responder resources,
        /// or a READ asking for more than the original (ferroce; rxe drops them too).
        resp_duplicates_dropped,
        /// READ/ATOMIC requests beyond the responder resources (`max_dest_rd_atomic`),
        /// answered NAK Invalid Request (ferroce).
        resp_rd_atomic_exceeded,
        /// ACK/NAKs not queued because `OUT_LIMIT` were already waiting (ferroce).
        resp_acks_dropped,
        /// ACKs sent.
        acks_sent,
        /// NAKs sent (any code, RNR excluded).
        naks_sent,
        /// ACKs received.
        acks_rcvd,
        /// READ responses received again for bytes already placed (a duplicated frame, or
        /// the original stream still arriving after a re-request) (ferroce).
        duplicate_responses,
        /// Responses that did not fit the outstanding requests (dropped, or BAD_RESP_ERR).
        unexpected_responses,
        /// Packets dropped because the QP's state does not accept them.
        rx_dropped_state,
        /// Packets dropped because their source or destination GID does not match the QP.
        rx_dropped_path,
        /// UD packets dropped for a Q_Key mismatch.
        rx_dropped_qkey,
        /// Packets dropped for a P_Key mismatch.
        rx_dropped_pkey,
        /// UC/UD packets dropped (sequence gap, no receive WQE, too long).
        rx_dropped_unreliable,
        /// Packets received with the IP ECN field set to CE (mlx5).
        np_ecn_marked_roce_packets,
        /// CNPs sent for CE-marked packets (mlx5).
        np_cnp_sent,
        /// CNPs received and acted on by the reaction point (mlx5).
        rp_cnp_handled,
        /// CNPs received while the reaction point is off (mlx5).
        rp_cnp_ignored,
    }
);

counters!(
    /// Device-wide counters that belong to no QP.
    DeviceCounters {
        /// Frames handed to the engine (named apart from the port's `rx_frames`).
        rx_engine_frames,
        /// Frames that failed the ICRC (mlx5's name).
        rx_icrc_encapsulated,
        /// Frames malformed otherwise.
        rx_malformed,
        /// Packets for a QP number that does not exist.
        rx_dropped_no_qp,
        /// Packets whose opcode does not match the QP's transport.
        rx_dropped_wrong_transport,
        /// Packets to QP1 (the GSI: connection manager MADs; the CM counts what it could not
        /// use).
        rx_gsi_mads,
        /// MADs QP1 sent for the connection manager.
        tx_gsi_mads,
        /// Packets to a destination GID that is not ours.
        rx_dropped_not_ours,
        /// Completions dropped because a CQ overflowed.
        cq_overflows,
        /// Congestion notification packets received (acted on by DCQCN).
        rx_cnp,
    }
);
