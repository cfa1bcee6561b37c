# qq_detect_archs.cmake - the CUDA architectures of this machine's GPUs, for a
# build that was not told QQ_CUDA_ARCHS (CMakeLists.txt; docs/build.md).
#
# qq_detect_gpu_archs(<out_archs> <out_why>): <out_archs> is the list of
# architectures of the GPUs `nvidia-smi --query-gpu=compute_cap` reports, in
# the spelling libqq's -gencode flags take: the arch-specific 'a' target for
# Hopper and Blackwell (9.0 -> 90a, 10.0 -> 100a, 10.3 -> 103a, 12.0 -> 120a,
# 12.1 -> 121a: an 'a' cubin runs only on exactly that compute capability, and
# libqq's wgmma / block-scaled / fp4 paths need the 'a' features), the plain
# number otherwise (8.0 -> 80, 8.9 -> 89). Empty when there is no GPU to ask
# (no nvidia-smi, no driver, no device: CI) or nvcc cannot build for one of
# them; <out_why> says which, for the configure log.
function(qq_detect_gpu_archs out_archs out_why)
  set(${out_archs} "" PARENT_SCOPE)
  find_program(QQ_NVIDIA_SMI nvidia-smi)
  if(NOT QQ_NVIDIA_SMI)
    set(${out_why} "no nvidia-smi, so no GPU to build for: the default list" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND "${QQ_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                  OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc TIMEOUT 30)
  string(STRIP "${_out}" _out)
  if(NOT _rc EQUAL 0 OR _out STREQUAL "")
    string(STRIP "${_err}${_out}" _msg)
    string(REGEX REPLACE "\n.*" "" _msg "${_msg}")
    set(${out_why} "nvidia-smi found no GPU (exit ${_rc}: ${_msg}): the default list" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND "${CMAKE_CUDA_COMPILER}" --list-gpu-code
                  OUTPUT_VARIABLE _codes RESULT_VARIABLE _rc2 ERROR_QUIET TIMEOUT 60)
  string(REPLACE "\n" ";" _lines "${_out}")
  set(_archs "")
  set(_caps "")
  foreach(_cap IN LISTS _lines)
    string(STRIP "${_cap}" _cap)
    if(NOT _cap MATCHES "^([0-9]+)\\.([0-9]+)$")
      set(${out_why} "nvidia-smi reported compute capability '${_cap}', which is not N.M: the default list" PARENT_SCOPE)
      return()
    endif()
    set(_major "${CMAKE_MATCH_1}")
    set(_num "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
    if(_rc2 EQUAL 0 AND NOT _codes MATCHES "sm_${_num}")
      set(${out_why} "this nvcc cannot build for the GPU's sm_${_num} (nvcc --list-gpu-code): the default list" PARENT_SCOPE)
      return()
    endif()
    if(_major EQUAL 10 OR _major EQUAL 12 OR _num STREQUAL "90")
      string(APPEND _num "a")
    endif()
    list(APPEND _archs "${_num}")
    list(APPEND _caps "${_cap}")
  endforeach()
  list(REMOVE_DUPLICATES _archs)
  list(REMOVE_DUPLICATES _caps)
  string(REPLACE ";" ", " _caps "${_caps}")
  set(${out_archs} "${_archs}" PARENT_SCOPE)
  set(${out_why} "this machine's GPU: compute capability ${_caps} (nvidia-smi); set QQ_CUDA_ARCHS to choose" PARENT_SCOPE)
endfunction()
