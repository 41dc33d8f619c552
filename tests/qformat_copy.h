/* quant/qformat.c once more, its public functions renamed QF_COPY(name)
 * (the includer defines QF_COPY and STZ_QF_CLONES): the quantizers built
 * for one instruction set, to compare with the library's clones. */
#define stz_qf_scale_value QF_COPY(scale_value)
#define stz_qf_scale_code QF_COPY(scale_code)
#define stz_qf_prepare QF_COPY(prepare)
#define stz_qf_row_bytes QF_COPY(row_bytes)
#define stz_qf_quantize_row QF_COPY(quantize_row)
#define stz_qf_dequantize_row QF_COPY(dequantize_row)
#define stz_qf_default_levels QF_COPY(default_levels)
#define stz_qf_fit_levels QF_COPY(fit_levels)
#include "../quant/qformat.c"
#undef stz_qf_scale_value
#undef stz_qf_scale_code
#undef stz_qf_prepare
#undef stz_qf_row_bytes
#undef stz_qf_quantize_row
#undef stz_qf_dequantize_row
#undef stz_qf_default_levels
#undef stz_qf_fit_levels
