# Optional peer benchmark bench/onednn_gemm (oneDNN matmul at the shapes of `corelm bench gemm`),
# built only when oneDNN is installed (Debian: libdnnl-dev). Nothing in the product links it;
# `corelm bench gemm` runs <build>/bench/onednn_gemm when the file exists.
find_path(CORELM_DNNL_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.hpp)
find_library(CORELM_DNNL_LIBRARY NAMES dnnl)
if(CORELM_DNNL_INCLUDE_DIR AND CORELM_DNNL_LIBRARY)
  add_executable(onednn_gemm ${PROJECT_SOURCE_DIR}/bench/onednn_gemm.cc)
  target_include_directories(onednn_gemm PRIVATE ${CORELM_DNNL_INCLUDE_DIR})
  target_link_libraries(onednn_gemm PRIVATE ${CORELM_DNNL_LIBRARY})
  set_target_properties(onednn_gemm PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
  # Built with the CLI so `corelm bench gemm` finds it.
  if(TARGET corelm_cli)
    add_dependencies(corelm_cli onednn_gemm)
  endif()
  message(STATUS "oneDNN found: building bench/onednn_gemm (peer benchmark)")
else()
  message(STATUS "oneDNN not found: corelm bench gemm runs without the oneDNN column (apt install libdnnl-dev)")
endif()
