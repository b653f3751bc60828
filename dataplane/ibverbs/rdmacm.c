/* librdmacm.so.1 for ferroce-run: the rdma_cm calls ferroce serves, each forwarded to the
 * function of the same signature in ferroce's libibverbs.so.1 (dataplane/ibverbs/src/
 * rdmacm.rs), which runs them over ferroce's connection manager. The Makefile adds a stub
 * (ENOSYS, saying so once) for every other symbol of the installed librdmacm, with the same
 * symbol versions (scripts/gen-dv-stubs.py --implemented this file). */
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

struct rdma_event_channel *ferroce_rdma_create_event_channel(void);
void ferroce_rdma_destroy_event_channel(struct rdma_event_channel *);
int ferroce_rdma_create_id(struct rdma_event_channel *, struct rdma_cm_id **, void *,
                           enum rdma_port_space);
int ferroce_rdma_destroy_id(struct rdma_cm_id *);
int ferroce_rdma_bind_addr(struct rdma_cm_id *, struct sockaddr *);
int ferroce_rdma_resolve_addr(struct rdma_cm_id *, struct sockaddr *, struct sockaddr *, int);
int ferroce_rdma_resolve_route(struct rdma_cm_id *, int);
int ferroce_rdma_create_qp(struct rdma_cm_id *, struct ibv_pd *, struct ibv_qp_init_attr *);
void ferroce_rdma_destroy_qp(struct rdma_cm_id *);
int ferroce_rdma_connect(struct rdma_cm_id *, struct rdma_conn_param *);
int ferroce_rdma_establish(struct rdma_cm_id *);
int ferroce_rdma_listen(struct rdma_cm_id *, int);
int ferroce_rdma_accept(struct rdma_cm_id *, struct rdma_conn_param *);
int ferroce_rdma_reject(struct rdma_cm_id *, const void *, uint8_t);
int ferroce_rdma_disconnect(struct rdma_cm_id *);
int ferroce_rdma_get_cm_event(struct rdma_event_channel *, struct rdma_cm_event **);
int ferroce_rdma_ack_cm_event(struct rdma_cm_event *);
const char *ferroce_rdma_event_str(enum rdma_cm_event_type);
int ferroce_rdma_set_option(struct rdma_cm_id *, int, int, void *, size_t);
int ferroce_rdma_migrate_id(struct rdma_cm_id *, struct rdma_event_channel *);
int ferroce_rdma_getaddrinfo(const char *, const char *, const struct rdma_addrinfo *,
                             struct rdma_addrinfo **);
void ferroce_rdma_freeaddrinfo(struct rdma_addrinfo *);
int ferroce_rdma_init_qp_attr(struct rdma_cm_id *, struct ibv_qp_attr *, int *);
int ferroce_rpoll(struct pollfd *, nfds_t, int);
int ferroce_rdma_create_ep(struct rdma_cm_id **, struct rdma_addrinfo *, struct ibv_pd *,
                           struct ibv_qp_init_attr *);
void ferroce_rdma_destroy_ep(struct rdma_cm_id *);
int ferroce_rdma_get_request(struct rdma_cm_id *, struct rdma_cm_id **);
int ferroce_rdma_create_qp_ex(struct rdma_cm_id *, struct ibv_qp_init_attr_ex *);

struct rdma_event_channel *rdma_create_event_channel(void) { return ferroce_rdma_create_event_channel(); }
void rdma_destroy_event_channel(struct rdma_event_channel *c) { ferroce_rdma_destroy_event_channel(c); }
int rdma_create_id(struct rdma_event_channel *c, struct rdma_cm_id **id, void *ctx,
                   enum rdma_port_space ps) { return ferroce_rdma_create_id(c, id, ctx, ps); }
int rdma_destroy_id(struct rdma_cm_id *id) { return ferroce_rdma_destroy_id(id); }
int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *a) { return ferroce_rdma_bind_addr(id, a); }
int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *s, struct sockaddr *d, int t)
{ return ferroce_rdma_resolve_addr(id, s, d, t); }
int rdma_resolve_route(struct rdma_cm_id *id, int t) { return ferroce_rdma_resolve_route(id, t); }
int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{ return ferroce_rdma_create_qp(id, pd, a); }
void rdma_destroy_qp(struct rdma_cm_id *id) { ferroce_rdma_destroy_qp(id); }
int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p) { return ferroce_rdma_connect(id, p); }
int rdma_establish(struct rdma_cm_id *id) { return ferroce_rdma_establish(id); }
int rdma_listen(struct rdma_cm_id *id, int b) { return ferroce_rdma_listen(id, b); }
int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p) { return ferroce_rdma_accept(id, p); }
int rdma_reject(struct rdma_cm_id *id, const void *d, uint8_t l) { return ferroce_rdma_reject(id, d, l); }
int rdma_disconnect(struct rdma_cm_id *id) { return ferroce_rdma_disconnect(id); }
int rdma_get_cm_event(struct rdma_event_channel *c, struct rdma_cm_event **e)
{ return ferroce_rdma_get_cm_event(c, e); }
int rdma_ack_cm_event(struct rdma_cm_event *e) { return ferroce_rdma_ack_cm_event(e); }
const char *rdma_event_str(enum rdma_cm_event_type e) { return ferroce_rdma_event_str(e); }
int rdma_set_option(struct rdma_cm_id *id, int l, int o, void *v, size_t n)
{ return ferroce_rdma_set_option(id, l, o, v, n); }
int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *c) { return ferroce_rdma_migrate_id(id, c); }
int rdma_getaddrinfo(const char *n, const char *s, const struct rdma_addrinfo *h,
                     struct rdma_addrinfo **r) { return ferroce_rdma_getaddrinfo(n, s, h, r); }
void rdma_freeaddrinfo(struct rdma_addrinfo *r) { ferroce_rdma_freeaddrinfo(r); }
int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *a, int *m)
{ return ferroce_rdma_init_qp_attr(id, a, m); }
int rpoll(struct pollfd *f, nfds_t n, int t) { return ferroce_rpoll(f, n, t); }
int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
                   struct ibv_qp_init_attr *a) { return ferroce_rdma_create_ep(id, res, pd, a); }
void rdma_destroy_ep(struct rdma_cm_id *id) { ferroce_rdma_destroy_ep(id); }
int rdma_get_request(struct rdma_cm_id *l, struct rdma_cm_id **id) { return ferroce_rdma_get_request(l, id); }
int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *a) { return ferroce_rdma_create_qp_ex(id, a); }
