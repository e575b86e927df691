# gz_project_target(<target>): warnings (errors with GRADZIP_WERROR), CPU tuning,
# and the repository root as the include root ("kernels/cast.h").
function(gz_project_target target)
  set(_cxx_warn -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wpedantic)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    # GCC 12 reports impossible overlaps inside std::string's operator+ (GCC bug 105329).
    list(APPEND _cxx_warn -Wno-restrict)
  endif()
  if(GRADZIP_WERROR)
    list(APPEND _cxx_warn -Werror)
  endif()
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${_cxx_warn}>)
  # No a*b+c contraction into FMA (g++ contracts C++ by default, even with
  # -std=c++20, and so do intrinsics): the CPU loops must round like the CUDA
  # kernels (--fmad=false) and like the tests' references.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)
  if(GRADZIP_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
  if(GZ_HAVE_CUDA)
    # -Werror=all-warnings turns nvcc's own diagnostics into errors too.
    set(_cu_opts -Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr)
    if(GRADZIP_WERROR)
      list(APPEND _cu_opts -Werror=all-warnings -Xcompiler=-Werror)
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${_cu_opts}>)
  endif()
endfunction()
