//! The RoCEv2 invariant CRC (IBA A17.3.3; Linux rxe_icrc.c; roce-wire.md "ICRC").
//!
//! A plain IEEE CRC-32 (zlib's) over: 8 bytes of 0xFF standing in for the masked LRH, the IP
//! header with its variant fields set to ones, the UDP header with its checksum set to ones,
//! the BTH with byte 4 (FECN, BECN, reserved) set to ones, then the remaining transport headers,
//! payload and pad. The result goes on the wire least-significant byte first.
//!
//! The computation is incremental: [`Icrc`] takes the masked header prefix once and then any
//! number of payload segments in place, so the payload is never copied.

use std::sync::LazyLock;

use super::{bth, ipv4, ipv6, udp};

/// CRC-32 state after the 8 bytes of 0xFF (finalised form; Linux's seed 0xdebb20e3 is its
/// complement).
const SEED_AFTER_LRH: u32 = 0x2144_df1c;

/// Longest masked prefix: IPv4 with maximal options (60) or IPv6 (40), + UDP 8 + BTH 12.
const MAX_PREFIX: usize = 60 + udp::HEADER_LEN + bth::HEADER_LEN;

/// A hasher whose finalised state is `init`. `Hasher::new_with_initial` asks for the CPU's
/// features each time (three cached lookups, some 45 instructions a 64 B message on the
/// data path); the two states the ICRC starts from are made once and copied.
fn hasher(init: u32) -> crc32fast::Hasher {
    static AFTER_LRH: LazyLock<crc32fast::Hasher> =
        LazyLock::new(|| crc32fast::Hasher::new_with_initial(SEED_AFTER_LRH));
    static ZERO_REGISTER: LazyLock<crc32fast::Hasher> =
        LazyLock::new(|| crc32fast::Hasher::new_with_initial(0xFFFF_FFFF));
    match init {
        SEED_AFTER_LRH => AFTER_LRH.clone(),
        0xFFFF_FFFF => ZERO_REGISTER.clone(),
        _ => crc32fast::Hasher::new_with_initial(init),
    }
}

/// Incremental ICRC computation.
#[derive(Clone)]
pub struct Icrc {
    hasher: crc32fast::Hasher,
}

impl Default for Icrc {
    fn default() -> Self {
        Icrc::new()
    }
}

impl Icrc {
    /// A computation that has consumed the 8 bytes of 0xFF.
    pub fn new() -> Icrc {
        Icrc {
            hasher: hasher(SEED_AFTER_LRH),
        }
    }

    /// Feeds bytes as they are (transport headers after the BTH, payload, pad). From
    /// [`SUM_MIN`] bytes on, on a CPU with AVX-512 and VPCLMULQDQ, 256 bytes are folded a
    /// round (a received payload is checked with it).
    #[inline]
    #[allow(unsafe_code)] // the one unsafe corner of this crate: see `fold512`
    pub fn update(&mut self, data: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if data.len() >= SUM_MIN && fold512::available() {
            // SAFETY: the CPU has the features (checked above).
            self.continue_with(|crc| unsafe { fold512::sum(crc, data) });
            return;
        }
        self.hasher.update(data);
    }

    /// Feeds `n` zero bytes (the pad).
    pub fn update_zeros(&mut self, n: usize) {
        const ZEROS: [u8; 4] = [0; 4];
        self.hasher.update(&ZEROS[..n.min(4)]);
    }

    /// Feeds the IP + UDP + BTH prefix with the variant fields masked. `prefix` must start at
    /// the IP header and hold exactly `ip_header_len + 8 + 12` bytes.
    pub fn update_masked_prefix(&mut self, prefix: &[u8], ipv6: bool, ip_header_len: usize) {
        let mut buf = [0u8; MAX_PREFIX];
        let n = prefix.len().min(MAX_PREFIX);
        buf[..n].copy_from_slice(&prefix[..n]);
        mask_prefix(&mut buf[..n], ipv6, ip_header_len);
        self.hasher.update(&buf[..n]);
    }

    /// The CRC value (to be written little-endian).
    pub fn finish(self) -> u32 {
        self.hasher.finalize()
    }

    /// Continues the computation with `fold`, which takes the CRC so far (finalised, as
    /// crc32fast hands it out) and returns it with more bytes folded in.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn continue_with(&mut self, fold: impl FnOnce(u32) -> u32) {
        self.hasher = hasher(fold(self.hasher.clone().finalize()));
    }

    /// Copies `src` into `dst` (same length) and feeds the bytes, as `dst.copy_from_slice(src)`
    /// then [`Icrc::update`] would. From [`FUSED_MIN`] bytes on, on a CPU with AVX-512 and
    /// VPCLMULQDQ, both are done in one pass: each block is loaded once, stored to `dst` and
    /// folded into the CRC from the same register, so the payload a transmitted packet carries
    /// is read once instead of twice (issue 22).
    #[allow(unsafe_code)] // the one unsafe corner of this crate: see `fold512`
    pub fn copy_from(&mut self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "Icrc::copy_from: lengths differ");
        // SAFETY: `src` is a slice of `dst.len()` bytes.
        unsafe { self.copy_from_raw(dst, src.as_ptr()) }
    }

    /// As [`Icrc::copy_from`] from memory that is not a Rust slice (an application's mapping,
    /// which its owner may write meanwhile, as a DMA engine would see it). Each source byte
    /// is loaded once, so the copy and the CRC always agree, whatever a concurrent writer does.
    ///
    /// # Safety
    /// `src` must be valid for reads of `dst.len()` bytes and not overlap `dst`.
    #[allow(unsafe_code)]
    pub unsafe fn copy_from_raw(&mut self, dst: &mut [u8], src: *const u8) {
        #[cfg(target_arch = "x86_64")]
        if dst.len() >= FUSED_MIN && fold512::available() {
            // SAFETY: the CPU has the features (checked above); the caller vouches for `src`.
            self.continue_with(|crc| unsafe { fold512::copy_and_sum(crc, dst, src) });
            return;
        }
        // SAFETY: the caller vouches for `src`; `dst` is a slice of that length.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        self.update(dst);
    }
}

/// Inputs from this length on take the one-pass copy and CRC of [`Icrc::copy_from`]: two
/// 256-byte rounds, so the 16 lanes' setup and collapse are spread over at least one fold.
/// Measured above it (`cargo bench -p roce --bench wire -- icrc/copy`): 1 KiB in 31 ns
/// against 55 ns in two passes; the crossover itself below 512 bytes was not measured.
pub const FUSED_MIN: usize = 512;

/// Inputs from this length on take the 512-bit fold of [`Icrc::update`] instead of
/// crc32fast's 128-bit one.
pub const SUM_MIN: usize = 256;

/// x^n mod P for the CRC-32 polynomial P = 0x104C11DB7 (normal bit order), at compile time.
const fn x_pow_mod_p(n: u32) -> u32 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= 0x1_04C1_1DB7;
        }
        i += 1;
    }
    r as u32
}

/// The folding constant that moves a 64-bit half of a 128-bit lane forward by `bits`, in
/// the reflected domain the bytes arrive in: x^(bits +/- 32) mod P, bit-reversed and shifted
/// left by one (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", 2009;
/// for 512 bits these are Linux's crc32-pclmul constants 0x154442bd4 and 0x1c6e41596, which
/// the tests check).
const fn fold_constants(bits: u32) -> (u64, u64) {
    (
        (x_pow_mod_p(bits + 32).reverse_bits() as u64) << 1,
        (x_pow_mod_p(bits - 32).reverse_bits() as u64) << 1,
    )
}

/// The one-pass copy and CRC on x86-64 with AVX-512F and VPCLMULQDQ. The crate forbids
/// unsafe code elsewhere; here it is needed for the CPU-specific intrinsics (selected at run
/// time) and for reading an application's mapping, which is not a Rust slice.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod fold512 {
    use std::arch::x86_64::*;

    /// Folding by 256 bytes (four registers of four lanes) and by 64 bytes (one register).
    const BY_256: (u64, u64) = super::fold_constants(2048);
    const BY_64: (u64, u64) = super::fold_constants(512);

    /// Whether this CPU runs [`copy_and_sum`] (the answer is cached by the standard library).
    #[inline]
    pub fn available() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("vpclmulqdq")
    }

    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn constants(k: (u64, u64)) -> __m512i {
        let (lo, hi) = (k.0 as i64, k.1 as i64);
        _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
    }

    /// Each 128-bit lane of `x` moved forward by the constants' distance, plus `v`: the low
    /// half times the first constant, the high half times the second, three-way XOR.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold(x: __m512i, k: __m512i, v: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(x, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(x, k, 0x11);
        _mm512_ternarylogic_epi64(lo, hi, v, 0x96)
    }

    /// Copies `dst.len()` (at least 256) bytes from `src` to `dst` and returns the CRC-32 of
    /// them continued from `crc` (a finalised value, as crc32fast's).
    ///
    /// # Safety
    /// The CPU has AVX-512F and VPCLMULQDQ ([`available`]); `src` is valid for reads of
    /// `dst.len()` bytes and does not overlap `dst`.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub unsafe fn copy_and_sum(crc: u32, dst: &mut [u8], src: *const u8) -> u32 {
        // SAFETY: as the caller vouches.
        unsafe { fold_all::<true>(crc, src, dst.as_mut_ptr(), dst.len()) }
    }

    /// The CRC-32 of `data` (at least 256 bytes) continued from `crc`, folding 256 bytes a
    /// round: what a received packet's payload is checked with.
    ///
    /// # Safety
    /// The CPU has AVX-512F and VPCLMULQDQ ([`available`]).
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    pub unsafe fn sum(crc: u32, data: &[u8]) -> u32 {
        // SAFETY: `data` is `data.len()` readable bytes; nothing is stored.
        unsafe { fold_all::<false>(crc, data.as_ptr(), std::ptr::null_mut(), data.len()) }
    }

    /// The CRC-32 of the `n` (at least 256) bytes at `src` continued from `crc`, each block
    /// also stored to `dst` from the register it was loaded into when `COPY`. CRC is linear:
    /// the lanes hold the message reduced to 64 bytes that leave a zero register where the
    /// whole message leaves `crc`'s register, so crc32fast finishes from those 64 bytes and
    /// the tail shorter than a register (taken from the copy when copying, so the CRC is of
    /// the bytes stored whatever a concurrent writer does to `src`).
    ///
    /// # Safety
    /// The CPU has the features; `src` is valid for reads of `n` bytes; when `COPY`, `dst`
    /// is valid for writes of `n` bytes and does not overlap `src`.
    #[inline]
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    unsafe fn fold_all<const COPY: bool>(crc: u32, src: *const u8, d: *mut u8, n: usize) -> u32 {
        debug_assert!(n >= 256);
        // SAFETY (every call): `at + 64 <= n`; unaligned loads and stores.
        let take = |at: usize| {
            let v = unsafe { _mm512_loadu_si512(src.add(at) as *const _) };
            if COPY {
                unsafe { _mm512_storeu_si512(d.add(at) as *mut _, v) };
            }
            v
        };
        let mut x = [take(0), take(64), take(128), take(192)];
        // The initial register goes into the first four bytes.
        x[0] = _mm512_xor_si512(x[0], _mm512_castsi128_si512(_mm_cvtsi32_si128(!crc as i32)));
        let k256 = constants(BY_256);
        let mut at = 256;
        while n - at >= 256 {
            for (i, lane) in x.iter_mut().enumerate() {
                *lane = fold(*lane, k256, take(at + i * 64));
            }
            at += 256;
        }
        let k64 = constants(BY_64);
        let mut acc = fold(fold(fold(x[0], k64, x[1]), k64, x[2]), k64, x[3]);
        while n - at >= 64 {
            acc = fold(acc, k64, take(at));
            at += 64;
        }
        let mut reduced = [0u8; 64];
        // SAFETY: 64 bytes.
        unsafe { _mm512_storeu_si512(reduced.as_mut_ptr() as *mut _, acc) };
        let tail = if COPY {
            // SAFETY: `at..n` is in bounds of both.
            unsafe { std::ptr::copy_nonoverlapping(src.add(at), d.add(at), n - at) };
            d as *const u8
        } else {
            src
        };
        let mut h = super::hasher(0xFFFF_FFFF);
        h.update(&reduced);
        // SAFETY: `at..n` is in bounds (of the copy when copying).
        h.update(unsafe { std::slice::from_raw_parts(tail.add(at), n - at) });
        h.finalize()
    }
}

/// Sets the variant fields of an IP + UDP + BTH prefix to ones (the table in roce-wire.md).
pub fn mask_prefix(buf: &mut [u8], ipv6: bool, ip_header_len: usize) {
    let set = |buf: &mut [u8], i: usize| {
        if let Some(b) = buf.get_mut(i) {
            *b = 0xff;
        }
    };
    if ipv6 {
        // Traffic class (8 bits) and flow label (20 bits); the version nibble is kept.
        if let Some(b) = buf.get_mut(0) {
            *b |= 0x0f;
        }
        for i in 1..4 {
            set(buf, i);
        }
        set(buf, ipv6::field::HOP_LIMIT);
    } else {
        set(buf, ipv4::field::TOS);
        set(buf, ipv4::field::TTL);
        set(buf, ipv4::field::CHECKSUM.start);
        set(buf, ipv4::field::CHECKSUM.start + 1);
    }
    let u = ip_header_len;
    set(buf, u + udp::field::CHECKSUM.start);
    set(buf, u + udp::field::CHECKSUM.start + 1);
    set(buf, u + udp::HEADER_LEN + bth::field::FECN_BECN);
}

/// ICRC of a contiguous region that starts at the IP header and ends just before the ICRC.
pub fn compute(l3: &[u8], ipv6: bool, ip_header_len: usize) -> u32 {
    let prefix = (ip_header_len + udp::HEADER_LEN + bth::HEADER_LEN).min(l3.len());
    let mut c = Icrc::new();
    c.update_masked_prefix(&l3[..prefix], ipv6, ip_header_len);
    c.update(&l3[prefix..]);
    c.finish()
}

/// ICRC of a contiguous region that starts at the IP header and ends just before the ICRC,
/// in one pass over it: the variant fields are set to ones in place for the computation and
/// restored after, so `l3` must be the caller's own bytes (a frame being built). One CRC call
/// instead of one per piece: what a packet's ICRC costs on transmit is mostly per call for
/// short frames. A region shorter than [`FOLD_MIN`] (a small message's frame) is
/// computed by [`compute_short`] instead.
pub fn compute_in_place(l3: &mut [u8], ipv6: bool, ip_header_len: usize) -> u32 {
    if l3.len() < FOLD_MIN {
        return compute_short(l3, ipv6, ip_header_len);
    }
    let prefix = (ip_header_len + udp::HEADER_LEN + bth::HEADER_LEN)
        .min(l3.len())
        .min(MAX_PREFIX);
    let mut saved = [0u8; MAX_PREFIX];
    saved[..prefix].copy_from_slice(&l3[..prefix]);
    mask_prefix(&mut l3[..prefix], ipv6, ip_header_len);
    let mut c = Icrc::new();
    c.update(l3);
    l3[..prefix].copy_from_slice(&saved[..prefix]);
    c.finish()
}

/// Inputs shorter than this take crc32fast's byte-table loop, which costs some 5
/// instructions a byte (570 for a 64 B WRITE's 120-byte region, counted with callgrind);
/// from this length on it folds 16 bytes at a time with carry-less multiplication.
pub const FOLD_MIN: usize = 128;

/// The CRC-32 register (not inverted) after `n` zero bytes fed from the state that follows
/// the LRH stand-in, for every `n` below [`FOLD_MIN`] (bit by bit, reflected polynomial
/// 0xEDB88320, at compile time).
const SHIFTED_SEED: [u32; FOLD_MIN] = {
    let mut t = [0u32; FOLD_MIN];
    let mut r = !SEED_AFTER_LRH;
    let mut n = 0;
    while n < FOLD_MIN {
        t[n] = r;
        let mut bit = 0;
        while bit < 8 {
            r = (r >> 1) ^ (0xEDB8_8320 & (r & 1).wrapping_neg());
            bit += 1;
        }
        n += 1;
    }
    t
};

/// ICRC of a region shorter than [`FOLD_MIN`], through the folding path: the masked region
/// is copied to the end of a zeroed [`FOLD_MIN`]-byte block, whose CRC is taken from a zero
/// register. CRC is linear: the register after `seed, data` is the register after `0, data`
/// XOR the seed's register moved through `len(data)` zero bytes ([`SHIFTED_SEED`]), and
/// zero bytes fed to a zero register leave it zero, so the leading zeros change nothing.
/// Reads `l3` only (the mask is applied to the copy).
pub fn compute_short(l3: &[u8], ipv6: bool, ip_header_len: usize) -> u32 {
    if l3.len() >= FOLD_MIN {
        // Folds directly: no padding to do.
        return compute(l3, ipv6, ip_header_len);
    }
    let n = l3.len();
    let mut block = [0u8; FOLD_MIN];
    let start = FOLD_MIN - n;
    block[start..].copy_from_slice(&l3[..n]);
    let prefix = (ip_header_len + udp::HEADER_LEN + bth::HEADER_LEN).min(n);
    mask_prefix(&mut block[start..start + prefix], ipv6, ip_header_len);
    // A zero register is the finalised (inverted) state 0xFFFF_FFFF; finalising inverts
    // back, so the hasher returns NOT(register) and the XOR below lands on NOT(result's
    // register), which is the CRC.
    let mut h = hasher(0xFFFF_FFFF);
    h.update(&block);
    h.finalize() ^ SHIFTED_SEED[n]
}

/// ICRC of a region held in several segments (e.g. an mbuf chain), starting at the IP header
/// and ending just before the ICRC. The masked prefix may straddle segments.
pub fn compute_segments<'a, I>(segments: I, ipv6: bool, ip_header_len: usize) -> u32
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let prefix_len = ip_header_len + udp::HEADER_LEN + bth::HEADER_LEN;
    let mut prefix = [0u8; MAX_PREFIX];
    let mut have = 0;
    let mut c = Icrc::new();
    let mut prefix_done = false;
    for seg in segments {
        let mut seg = seg;
        if !prefix_done {
            let take = (prefix_len - have).min(seg.len());
            prefix[have..have + take].copy_from_slice(&seg[..take]);
            have += take;
            seg = &seg[take..];
            if have == prefix_len {
                c.update_masked_prefix(&prefix[..have], ipv6, ip_header_len);
                prefix_done = true;
            }
        }
        if prefix_done {
            c.update(seg);
        }
    }
    if !prefix_done {
        c.update_masked_prefix(&prefix[..have], ipv6, ip_header_len);
    }
    c.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn noise(rng: &mut crate::sim::Rng, n: usize) -> Vec<u8> {
        (0..n).map(|_| rng.next_u64() as u8).collect()
    }

    /// Calls `check(rng, n, data)` with `n` bytes of noise for every length class of the
    /// folds (each length below 1100, whole and ragged pages, beyond 64 KiB), the bytes
    /// starting `n % skew` bytes into their allocation (misaligned).
    fn for_every_length(
        seed: u64,
        skew: usize,
        mut check: impl FnMut(&mut crate::sim::Rng, usize, &[u8]),
    ) {
        let mut rng = crate::sim::Rng::new(seed);
        for n in (0..1100).chain([4096, 4096 + 8, 4096 + 63, 8191, 65536 + 17]) {
            let misalign = n % skew;
            let data = noise(&mut rng, n + misalign);
            check(&mut rng, n, &data[misalign..]);
        }
    }

    #[test]
    fn folding_constants_are_linuxs_for_512_bits() {
        assert_eq!(fold_constants(512), (0x1_5444_2bd4, 0x1_c6e4_1596));
        // and for 128 bits (crc32-pclmul's R3, R4)
        assert_eq!(fold_constants(128), (0x1_7519_97d0, 0x0_ccaa_009e));
    }

    /// The one-pass copy gives the bytes and the CRC of a copy followed by crc32fast, for
    /// every length class (below [`FUSED_MIN`], whole 256-byte rounds, 64-byte steps, tails),
    /// misaligned source and destination, and any starting state.
    #[test]
    fn one_pass_copy_and_crc_agree_with_two_passes() {
        for_every_length(7, 13, |rng, n, src| {
            let init = noise(rng, 4);
            let init = u32::from_le_bytes(init.try_into().unwrap());
            let mut want = crc32fast::Hasher::new_with_initial(init);
            want.update(src);
            let mut dst = vec![0u8; n + 5];
            let mut c = Icrc {
                hasher: hasher(init),
            };
            c.copy_from(&mut dst[5 - n % 5..][..n], src);
            assert_eq!(c.finish(), want.finalize(), "length {n}");
            assert_eq!(&dst[5 - n % 5..][..n], src, "length {n}");
        });
    }

    /// The CPU-specific path directly, where the CPU has it (the machines this project runs on
    /// do), so a broken kernel cannot hide behind the fallback.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[allow(unsafe_code)]
    fn the_avx512_path_is_taken_and_agrees() {
        if !fold512::available() {
            eprintln!("no AVX-512 VPCLMULQDQ on this CPU: the fallback is what runs");
            return;
        }
        let mut rng = crate::sim::Rng::new(11);
        for n in [256, 300, 511, 512, 1000, 4096, 9000] {
            let src = noise(&mut rng, n);
            let mut dst = vec![0u8; n];
            // SAFETY: features checked; `src` holds n bytes.
            let got = unsafe { fold512::copy_and_sum(0x1234_5678, &mut dst, src.as_ptr()) };
            let mut want = crc32fast::Hasher::new_with_initial(0x1234_5678);
            want.update(&src);
            let want = want.finalize();
            assert_eq!(got, want, "length {n}");
            assert_eq!(dst, src);
            // SAFETY: features checked.
            let summed = unsafe { fold512::sum(0x1234_5678, &src) };
            assert_eq!(summed, want, "sum, length {n}");
        }
    }

    /// `Icrc::update` (the 512-bit fold from [`SUM_MIN`] bytes on) gives crc32fast's value
    /// for every length class, misaligned inputs, fed in one piece or split anywhere.
    #[test]
    fn update_agrees_with_crc32fast_at_every_length() {
        for_every_length(13, 11, |rng, n, data| {
            let mut want = crc32fast::Hasher::new_with_initial(SEED_AFTER_LRH);
            want.update(data);
            let want = want.finalize();
            let mut whole = Icrc::new();
            whole.update(data);
            assert_eq!(whole.finish(), want, "length {n}");
            let cut = rng.below(n as u64 + 1) as usize;
            let mut split = Icrc::new();
            split.update(&data[..cut]);
            split.update(&data[cut..]);
            assert_eq!(split.finish(), want, "length {n} cut at {cut}");
        });
    }

    /// The ConnectX-4 Lx CNP from scapy's test suite (roce-wire.md): DSCP 48, ECT(0), BECN.
    pub(crate) const CX4_CNP: &str = "e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a001201000012b7002800008100ffff40000118000000000000000000000000000000000000000082fd002a";

    pub(crate) fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn hardware_cnp_verifies() {
        let f = hex(CX4_CNP);
        let l3 = &f[14..f.len() - 4];
        let crc = compute(l3, false, 20);
        assert_eq!(crc, 0x2a00_fd82);
        assert_eq!(&crc.to_le_bytes(), &f[f.len() - 4..]);
        // Split anywhere, including inside the masked prefix: same value.
        for cut in [1, 5, 20, 27, 30, 39, 40, 41, l3.len() - 1] {
            let (a, b) = l3.split_at(cut);
            assert_eq!(compute_segments([a, b], false, 20), crc, "cut at {cut}");
        }
        let (a, rest) = l3.split_at(3);
        let (b, c) = rest.split_at(30);
        assert_eq!(compute_segments([a, &[][..], b, c], false, 20), crc);
    }

    #[test]
    fn in_place_computation_agrees_and_leaves_the_bytes_as_they_were() {
        let f = hex(CX4_CNP);
        let mut l3 = f[14..f.len() - 4].to_vec();
        let before = l3.clone();
        assert_eq!(compute_in_place(&mut l3, false, 20), 0x2a00_fd82);
        assert_eq!(l3, before);
        // IPv6 and an odd length: as the piecewise computation.
        let mut v6: Vec<u8> = (0..97u8).collect();
        v6[0] = 0x60;
        let want = compute(&v6, true, 40);
        let before = v6.clone();
        assert_eq!(compute_in_place(&mut v6, true, 40), want);
        assert_eq!(v6, before);
    }

    /// The short-frame path agrees with the piecewise computation at every length it takes,
    /// for IPv4 and IPv6, and the in-place one uses it below `FOLD_MIN` (leaving the bytes).
    #[test]
    fn short_regions_agree_with_the_byte_loop() {
        let mut rng = crate::sim::Rng::new(3);
        for len in 0..FOLD_MIN + 8 {
            for (ipv6, hl) in [(false, 20), (true, 40)] {
                let mut l3: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                let want = compute(&l3, ipv6, hl);
                assert_eq!(compute_short(&l3, ipv6, hl), want, "len {len} v6 {ipv6}");
                let before = l3.clone();
                assert_eq!(compute_in_place(&mut l3, ipv6, hl), want, "len {len}");
                assert_eq!(l3, before);
            }
        }
        let f = hex(CX4_CNP);
        assert_eq!(compute_short(&f[14..f.len() - 4], false, 20), 0x2a00_fd82);
    }

    #[test]
    fn seed_is_the_lrh_stand_in() {
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xff; 8]);
        assert_eq!(h.finalize(), SEED_AFTER_LRH);
        assert_eq!(!SEED_AFTER_LRH, 0xdebb_20e3, "Linux rxe's seed");
    }
}
