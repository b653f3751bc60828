/*
 * libmlx5.so.1 for ferroce-run: the mlx5 direct-verbs entry points Debian's perftest links
 * against. ferroce's devices are not mlx5 devices, so every call answers "not supported"
 * (NULL or EOPNOTSUPP, with errno), as the real library does for a non-mlx5 device. Loaded
 * instead of the real libmlx5, which needs a kernel uverbs device and libibverbs' private ABI.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#define NOT_MLX5_PTR { errno = EOPNOTSUPP; return NULL; }
#define NOT_MLX5_INT { errno = EOPNOTSUPP; return EOPNOTSUPP; }

void *mlx5dv_create_qp(void *context, void *qp_attr, void *mlx5_qp_attr) NOT_MLX5_PTR
void *mlx5dv_open_device(void *device, void *attr) NOT_MLX5_PTR
int mlx5dv_devx_general_cmd(void *context, const void *in, size_t inlen, void *out, size_t outlen) NOT_MLX5_INT
void *mlx5dv_qp_ex_from_ibv_qp_ex(void *qp) NOT_MLX5_PTR
void *mlx5dv_create_mkey(void *mkey_init_attr) NOT_MLX5_PTR
int mlx5dv_destroy_mkey(void *mkey) NOT_MLX5_INT
void *mlx5dv_dek_create(void *context, void *init_attr) NOT_MLX5_PTR
int mlx5dv_dek_destroy(void *dek) NOT_MLX5_INT
int mlx5dv_crypto_login(void *context, void *login_attr) NOT_MLX5_INT
int mlx5dv_is_supported(void *device) { return 0; }
int mlx5dv_query_device(void *ctx, void *attrs_out) NOT_MLX5_INT
