//! Invalidate Extended Transport Header (IETH, IBA 9.3.7, 4 bytes): the R_Key that a SEND with
//! invalidate asks the responder to invalidate.

use super::Rkey;

super::header! {
    /// High-level IETH.
    IethRepr: 4 bytes, ExtHeaders;
    /// The R_Key to invalidate.
    RKEY[0..4] => rkey -> rkey: Rkey;
}
