# bench/sliding_attention_bench: ops::sliding_window_attention against ops::causal_attention at one
# training shape (issue 17), JSON on stdout. A plain program (no GoogleTest), built on demand:
# `cmake --build --preset release --target sliding_attention_bench`.
add_executable(sliding_attention_bench EXCLUDE_FROM_ALL ${PROJECT_SOURCE_DIR}/bench/sliding_attention_bench.cc)
target_link_libraries(sliding_attention_bench PRIVATE corelm_ops)
set_target_properties(sliding_attention_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
