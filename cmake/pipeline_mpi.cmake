# System libraries of the corpus pipeline (src/pipeline): zlib and libzstd read compressed JSONL
# inputs; OpenMPI (optional) lets `mpirun -np N corelm run ...` split a run across ranks. MPI is
# linked into the pipeline only; the code calls MPI_Init only when launched by mpirun or with --mpi.
if(TARGET corelm_pipeline)
  find_package(ZLIB REQUIRED)
  find_library(CORELM_PIPELINE_ZSTD_LIB zstd REQUIRED)
  target_link_libraries(corelm_pipeline PUBLIC ZLIB::ZLIB ${CORELM_PIPELINE_ZSTD_LIB})
  # FindMPI's C component needs the C language (the project itself is C++ only).
  include(CheckLanguage)
  check_language(C)
  if(CMAKE_C_COMPILER)
    enable_language(C)
    find_package(MPI COMPONENTS C QUIET)
  endif()
  if(MPI_C_FOUND)
    target_link_libraries(corelm_pipeline PUBLIC MPI::MPI_C)
    target_compile_definitions(corelm_pipeline PRIVATE CORELM_HAVE_MPI)
    message(STATUS "corelm pipeline: MPI mode enabled (${MPI_C_LIBRARIES})")
  else()
    message(STATUS "corelm pipeline: MPI not found (libopenmpi-dev); `corelm run --mpi` will be unavailable")
  endif()
endif()
