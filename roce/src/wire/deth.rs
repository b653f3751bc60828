//! Datagram Extended Transport Header (IBA 9.3.2, 8 bytes): Q_Key and source QP (UD).

use super::{Qkey, Qpn};

super::header! {
    /// High-level DETH.
    DethRepr: 8 bytes, ExtHeaders;
    /// Queue key.
    QKEY[0..4] => qkey -> qkey: Qkey;
    /// Source QP.
    SRC_QP[5..8] => src_qp -> src_qp: Qpn;
    /// The reserved byte (as carried).
    RESV[4] => resv -> resv: u8;
}
