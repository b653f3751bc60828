/*
 * libefa.so.1 for ferroce-run: the EFA direct-verbs entry points Debian's perftest links
 * against. ferroce's devices are not EFA devices: every call answers EOPNOTSUPP.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

int efadv_query_device(void *ibvctx, void *attr, uint32_t inlen) { errno = EOPNOTSUPP; return EOPNOTSUPP; }
void *efadv_create_qp_ex(void *ibvctx, void *attr_ex, void *efa_attr, uint32_t inlen) { errno = EOPNOTSUPP; return NULL; }
void *efadv_create_driver_qp(void *ibvpd, void *attr, uint32_t driver_qp_type) { errno = EOPNOTSUPP; return NULL; }
