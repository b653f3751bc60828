/* See shim.h: one-line forwards to DPDK's static-inline functions and macros. */
#include "shim.h"

int ferroce_errno(void) { return rte_errno; }
void ferroce_set_errno(int e) { rte_errno = e; }
unsigned ferroce_lcore_id(void) { return rte_lcore_id(); }
uint64_t ferroce_rdtsc(void) { return rte_rdtsc(); }
uint64_t ferroce_tsc_hz(void) { return rte_get_tsc_hz(); }
void ferroce_pause(void) { rte_pause(); }

uint16_t ferroce_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t ferroce_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_tx_burst(port, queue, pkts, n);
}

struct rte_mbuf *ferroce_pktmbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }

int ferroce_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void ferroce_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }

void ferroce_pktmbuf_free_bulk(struct rte_mbuf **mbufs, unsigned count)
{
	rte_pktmbuf_free_bulk(mbufs, count);
}

char *ferroce_pktmbuf_append(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_append(m, len); }
char *ferroce_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_prepend(m, len); }
char *ferroce_pktmbuf_adj(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_adj(m, len); }
int ferroce_pktmbuf_trim(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_trim(m, len); }
int ferroce_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail) { return rte_pktmbuf_chain(head, tail); }
void ferroce_pktmbuf_reset(struct rte_mbuf *m) { rte_pktmbuf_reset(m); }
uint16_t ferroce_pktmbuf_headroom(const struct rte_mbuf *m) { return rte_pktmbuf_headroom(m); }
uint16_t ferroce_pktmbuf_tailroom(const struct rte_mbuf *m) { return rte_pktmbuf_tailroom(m); }
uint16_t ferroce_pktmbuf_data_room_size(struct rte_mempool *mp) { return rte_pktmbuf_data_room_size(mp); }
void *ferroce_pktmbuf_mtod(const struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, void *); }
uint16_t ferroce_mbuf_refcnt_read(const struct rte_mbuf *m) { return rte_mbuf_refcnt_read(m); }
uint16_t ferroce_mbuf_refcnt_update(struct rte_mbuf *m, int16_t value) { return rte_mbuf_refcnt_update(m, value); }

void ferroce_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr, uint64_t buf_iova,
                                   uint16_t buf_len, struct rte_mbuf_ext_shared_info *shinfo)
{
	rte_pktmbuf_attach_extbuf(m, buf_addr, buf_iova, buf_len, shinfo);
}

uint16_t ferroce_mbuf_ext_refcnt_update(struct rte_mbuf_ext_shared_info *shinfo, int16_t value)
{
	return rte_mbuf_ext_refcnt_update(shinfo, value);
}

int ferroce_mbuf_has_extbuf(const struct rte_mbuf *m) { return RTE_MBUF_HAS_EXTBUF(m) ? 1 : 0; }
unsigned ferroce_mempool_in_use_count(const struct rte_mempool *mp) { return rte_mempool_in_use_count(mp); }
unsigned ferroce_mempool_avail_count(const struct rte_mempool *mp) { return rte_mempool_avail_count(mp); }

unsigned ferroce_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned n,
                                    unsigned *free_space)
{
	return rte_ring_enqueue_burst(r, objs, n, free_space);
}

unsigned ferroce_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned n,
                                    unsigned *available)
{
	return rte_ring_dequeue_burst(r, objs, n, available);
}

unsigned ferroce_ring_count(const struct rte_ring *r) { return rte_ring_count(r); }
