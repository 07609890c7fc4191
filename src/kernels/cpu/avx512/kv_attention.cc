// quant_attention_head compiled with the AVX-512 flags (see kv_attention_impl.h).
#define CORELM_KV_ATTENTION_NAME quant_attention_head_avx512
#include "kernels/cpu/kv_attention_impl.h"
