/*
 * ferroce shim: out-of-line wrappers for DPDK's static-inline fast path and macros.
 *
 * DPDK implements its per-packet API (rx/tx burst, mbuf alloc/free, ring bursts, TSC) as
 * `static inline` functions and macros, which bindgen cannot link against. Each wrapper here is
 * a one-line forward; they carry the prefix `ferroce_` so bindgen's allowlist picks them up.
 */
#ifndef FERROCE_SHIM_H
#define FERROCE_SHIM_H

#include <stdint.h>
#include <rte_config.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ethdev.h>
#include <rte_ring.h>
#include <rte_bus_vdev.h>
#include <rte_eth_ring.h>
#include <rte_dev.h>
#include <rte_version.h>

/* errno / lcore / time */
int ferroce_errno(void);
void ferroce_set_errno(int e);
unsigned ferroce_lcore_id(void);
uint64_t ferroce_rdtsc(void);
uint64_t ferroce_tsc_hz(void);
void ferroce_pause(void);

/* ethdev fast path */
uint16_t ferroce_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t ferroce_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);

/* mbuf */
struct rte_mbuf *ferroce_pktmbuf_alloc(struct rte_mempool *mp);
int ferroce_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count);
void ferroce_pktmbuf_free(struct rte_mbuf *m);
void ferroce_pktmbuf_free_bulk(struct rte_mbuf **mbufs, unsigned count);
char *ferroce_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
char *ferroce_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len);
char *ferroce_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);
int ferroce_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
int ferroce_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail);
void ferroce_pktmbuf_reset(struct rte_mbuf *m);
uint16_t ferroce_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t ferroce_pktmbuf_tailroom(const struct rte_mbuf *m);
uint16_t ferroce_pktmbuf_data_room_size(struct rte_mempool *mp);
void *ferroce_pktmbuf_mtod(const struct rte_mbuf *m);
uint16_t ferroce_mbuf_refcnt_read(const struct rte_mbuf *m);
uint16_t ferroce_mbuf_refcnt_update(struct rte_mbuf *m, int16_t value);
void ferroce_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr, uint64_t buf_iova,
                                   uint16_t buf_len, struct rte_mbuf_ext_shared_info *shinfo);
uint16_t ferroce_mbuf_ext_refcnt_update(struct rte_mbuf_ext_shared_info *shinfo, int16_t value);
int ferroce_mbuf_has_extbuf(const struct rte_mbuf *m);
unsigned ferroce_mempool_in_use_count(const struct rte_mempool *mp);
unsigned ferroce_mempool_avail_count(const struct rte_mempool *mp);

/* rings */
unsigned ferroce_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned n,
                                    unsigned *free_space);
unsigned ferroce_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned n,
                                    unsigned *available);
unsigned ferroce_ring_count(const struct rte_ring *r);

#endif
