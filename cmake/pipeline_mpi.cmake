# System libraries of the corpus pipeline (src/pipeline): zlib and libzstd read compressed JSONL
# inputs. MPI (`mpirun -np N corelm run ...`) comes through corelm_dist (cmake/dist_mpi.cmake).
if(TARGET corelm_pipeline)
  find_package(ZLIB REQUIRED)
  find_library(CORELM_PIPELINE_ZSTD_LIB zstd REQUIRED)
  target_link_libraries(corelm_pipeline PUBLIC ZLIB::ZLIB ${CORELM_PIPELINE_ZSTD_LIB})
endif()
