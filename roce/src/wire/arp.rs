//! ARP (RFC 826). ferroce uses smoltcp's implementation of the wire format (a chosen
//! dependency, see DEVELOPERS.md); this module re-exports it so every header ferroce handles is
//! reachable from `roce::wire`. The neighbour table built on it lives in the dataplane.

pub use smoltcp::wire::{ArpHardware, ArpOperation, ArpPacket, ArpRepr, EthernetAddress};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request() {
        let repr = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Request,
            source_hardware_addr: EthernetAddress([2, 0, 0, 0x99, 0, 3]),
            source_protocol_addr: [10, 99, 0, 3].into(),
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: [10, 99, 0, 2].into(),
        };
        let mut b = [0u8; 28];
        repr.emit(&mut ArpPacket::new_unchecked(&mut b[..]));
        let back = ArpRepr::parse(&ArpPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(back, repr);
    }
}
