# loom's install rules (LOOM_INSTALL): the libraries, the headers under
# include/loom/, the apps (LOOM_BUILD_APPS), the CMake package in
# lib/cmake/loom (loomConfig.cmake, loomConfigVersion.cmake, loomTargets.cmake
# with the loom:: targets) and lib/pkgconfig/loom.pc. Every path in the
# installed files is relative to the installation, so it can be moved.
include(CMakePackageConfigHelpers)
set(LOOM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/loom)

# ---- libraries, programs, headers ----
get_property(_loom_targets GLOBAL PROPERTY LOOM_LIBRARY_TARGETS)
list(APPEND _loom_targets loom)
if(LOOM_HAVE_CUDA)
  # The CUDA libraries loom links (cudart, cuBLAS, cuDNN), as loom::cuda_libraries.
  set_target_properties(loom_cuda_libraries PROPERTIES EXPORT_NAME cuda_libraries)
  list(APPEND _loom_targets loom_cuda_libraries)
  if(TARGET loom_cublas)
    set_target_properties(loom_cublas PROPERTIES EXPORT_NAME cublas)
    list(APPEND _loom_targets loom_cublas)
  endif()
endif()
if(LOOM_BUILD_APPS)
  list(APPEND _loom_targets train_mnist train_resnet50_cifar loomrun)
endif()
install(TARGETS ${_loom_targets} EXPORT loomTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Every header of the library directories, at include/loom/<dir>/..., but
# cudnn_descriptors.h, which needs cudnn.h and serves loom's .cu files only;
# and the ops' kernel lists (ops/<op>_kernels.def) the headers include.
foreach(dir IN LISTS LOOM_LIBRARY_DIRS)
  file(GLOB_RECURSE _loom_headers RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${dir}/*.h
       ${PROJECT_SOURCE_DIR}/${dir}/*.def)
  list(FILTER _loom_headers EXCLUDE REGEX "/cudnn_descriptors\\.h$")
  foreach(header IN LISTS _loom_headers)
    get_filename_component(_loom_header_dir ${header} DIRECTORY)
    install(FILES ${PROJECT_SOURCE_DIR}/${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom/${_loom_header_dir})
  endforeach()
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/loom.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loom)

# ---- CMake package ----
set(LOOM_SHARED_LIBS OFF)
if(BUILD_SHARED_LIBS)
  set(LOOM_SHARED_LIBS ON)
endif()
install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${LOOM_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/loomConfig.cmake.in ${PROJECT_BINARY_DIR}/loomConfig.cmake
                              INSTALL_DESTINATION ${LOOM_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so 0.6 accepts 0.6.x only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/loomConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/loomConfig.cmake ${PROJECT_BINARY_DIR}/loomConfigVersion.cmake
        DESTINATION ${LOOM_INSTALL_CMAKEDIR})
if(LOOM_HAVE_CUDA)
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/FindCUDNN.cmake ${PROJECT_SOURCE_DIR}/cmake/FindNCCL.cmake
                ${PROJECT_SOURCE_DIR}/cmake/LoomFindCudaLibrary.cmake
          DESTINATION ${LOOM_INSTALL_CMAKEDIR})
endif()

# ---- pkg-config ----
# Static libraries need their private dependencies on the program's link line
# (Libs); shared ones carry them (Libs.private, for pkg-config --static).
file(RELATIVE_PATH LOOM_PC_PREFIX_FROM_PCFILEDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" LOOM_PC_PREFIX_FROM_PCFILEDIR "${LOOM_PC_PREFIX_FROM_PCFILEDIR}")
set(LOOM_PC_CFLAGS "-fopenmp")
set(_loom_pc_public "-fopenmp -pthread")
set(_loom_pc_private "$<TARGET_LINKER_FILE:gloo> ${ZLIB_LIBRARIES} ${PNG_LIBRARY} ${JPEG_LIBRARIES} ${TURBOJPEG_LIBRARY} -lrt")
if(LOOM_HAVE_CUDA)
  string(APPEND LOOM_PC_CFLAGS " -DLOOM_HAVE_CUDA=1")
  get_target_property(_loom_ops_definitions loom_ops INTERFACE_COMPILE_DEFINITIONS)
  if("LOOM_CUDA_OPS=1" IN_LIST _loom_ops_definitions)
    string(APPEND LOOM_PC_CFLAGS " -DLOOM_CUDA_OPS=1")
  endif()
  if(TARGET loom_cublas)
    set(_loom_pc_cublas "${LOOM_CUBLAS_LIBRARY} ${LOOM_CUBLASLT_LIBRARY}")
  else()
    set(_loom_pc_cublas "-lcublas -lcublasLt")
  endif()
  string(APPEND _loom_pc_public " -L${CUDAToolkit_LIBRARY_DIR} -lcudart ${_loom_pc_cublas} ${CUDNN_LIBRARY}")
  if(LOOM_HAVE_NCCL)
    string(APPEND _loom_pc_private " ${NCCL_LIBRARY}")
  endif()
endif()
if(BUILD_SHARED_LIBS)
  set(LOOM_PC_LIBS "${_loom_pc_public}")
  set(LOOM_PC_LIBS_PRIVATE "${_loom_pc_private}")
else()
  set(LOOM_PC_LIBS "${_loom_pc_public} ${_loom_pc_private}")
  set(LOOM_PC_LIBS_PRIVATE "")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/loom.pc.in ${PROJECT_BINARY_DIR}/loom.pc.in @ONLY)
file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/loom.pc INPUT ${PROJECT_BINARY_DIR}/loom.pc.in)
install(FILES ${PROJECT_BINARY_DIR}/loom.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
