# Fast kernels live in one folder per instruction set (src/kernels/cpu/<isa>/) and are compiled
# with that ISA's flags only; the rest of the build stays baseline x86-64, so the binary runs on
# any x86-64 CPU and picks its kernels at run time (include/corelm/isa.h).
function(corelm_isa_flags folder flags)
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/kernels/cpu/${folder}/*.cc)
  if(sources)
    set_source_files_properties(${sources} TARGET_DIRECTORY corelm_kernels PROPERTIES COMPILE_OPTIONS "${flags}")
  endif()
endfunction()
corelm_isa_flags(avx2 "-mavx2;-mfma;-mf16c")
corelm_isa_flags(avx512 "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq")
corelm_isa_flags(avx512_bf16 "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16;-mavx512vnni")
corelm_isa_flags(amx "-mavx2;-mfma;-mf16c;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16;-mavx512vnni;-mamx-tile;-mamx-bf16;-mamx-int8")
