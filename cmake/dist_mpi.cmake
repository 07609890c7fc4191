# OpenMPI for src/dist (corelm_dist, include/corelm/mpi.h): the only library that links MPI. The
# corpus runner (`mpirun -np N corelm run ...`) and data-parallel training (`mpirun -np N corelm
# train ...`) reach MPI through it. Without libopenmpi-dev it builds as a one-process stub; the
# code calls MPI_Init only when launched by mpirun/srun or when forced (--mpi).
if(TARGET corelm_dist)
  # FindMPI's C component needs the C language (the project itself is C++ only).
  include(CheckLanguage)
  check_language(C)
  if(CMAKE_C_COMPILER)
    enable_language(C)
    find_package(MPI COMPONENTS C QUIET)
  endif()
  if(MPI_C_FOUND)
    target_link_libraries(corelm_dist PUBLIC MPI::MPI_C)
    target_compile_definitions(corelm_dist PRIVATE CORELM_HAVE_MPI)
    message(STATUS "corelm dist: MPI enabled (${MPI_C_LIBRARIES})")
  else()
    message(STATUS "corelm dist: MPI not found (libopenmpi-dev); `corelm run --mpi` and `mpirun ... corelm train` will be unavailable")
  endif()
endif()
