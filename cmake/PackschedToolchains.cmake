# Optional toolchain parts. Each PACKSCHED_WITH_* option switches itself off, with a message,
# when what it needs is missing, so the same configure line works on GPU and CPU-only machines.

include(CheckLanguage)

if(PACKSCHED_WITH_CUDA)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # 80 (A100) in CI; release builds pass -DCMAKE_CUDA_ARCHITECTURES="80;90".
      set(CMAKE_CUDA_ARCHITECTURES 80)
    endif()
    # One shared libcudart for every target (CUDA::cudart); the static default would link a
    # second copy of the runtime into executables that also get CUDA::cudart.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
  else()
    message(STATUS "packsched: nvcc not found, CUDA kernels off")
    set(PACKSCHED_WITH_CUDA OFF)
  endif()
endif()

if(PACKSCHED_WITH_NCCL)
  if(NOT PACKSCHED_WITH_CUDA)
    message(STATUS "packsched: NCCL backend off (needs CUDA)")
    set(PACKSCHED_WITH_NCCL OFF)
  else()
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      add_library(packsched_nccl_imported INTERFACE)
      target_include_directories(packsched_nccl_imported INTERFACE ${NCCL_INCLUDE_DIR})
      # CUDA::cudart only: libcuda.so.1 is absent on GPU-less machines.
      target_link_libraries(packsched_nccl_imported INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
      add_library(NCCL::nccl ALIAS packsched_nccl_imported)
    else()
      message(STATUS "packsched: nccl.h/libnccl not found, NCCL backend off")
      set(PACKSCHED_WITH_NCCL OFF)
    endif()
  endif()
endif()

if(PACKSCHED_WITH_PYTHON)
  if(SKBUILD)
    # A wheel build (pip install ., python -m build): scikit-build-core passes the interpreter the
    # wheel is for as Python_EXECUTABLE. It wins over PACKSCHED_PYTHON, whose default
    # (/usr/bin/python3) would build the modules for another Python than the wheel's tags say.
    set(PACKSCHED_PYTHON ${Python_EXECUTABLE})
  else()
    set(Python_EXECUTABLE ${PACKSCHED_PYTHON})  # FindPython takes this interpreter, no other
  endif()
  find_package(Python COMPONENTS Interpreter Development.Module)
  # The interpreter's own pybind11 (PyPI's, in the venv) wins over the system's: it is the one
  # made for the interpreter's numpy. Modules built with a pybind11 before 2.12 misread numpy 2's
  # arrays without an error (numpy 2 moved fields of its descriptor struct): Debian's is 2.10.
  if(Python_FOUND)
    execute_process(COMMAND ${Python_EXECUTABLE} -m pybind11 --cmakedir
                    OUTPUT_VARIABLE _pybind11_dir OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _pybind11_rc ERROR_QUIET)
    if(_pybind11_rc EQUAL 0 AND EXISTS "${_pybind11_dir}")
      set(pybind11_DIR "${_pybind11_dir}" CACHE PATH "pybind11's CMake config" FORCE)
    endif()
  endif()
  find_package(pybind11 CONFIG)
  if(Python_FOUND AND pybind11_FOUND)
    execute_process(COMMAND ${Python_EXECUTABLE} -c "import numpy; print(numpy.__version__)"
                    OUTPUT_VARIABLE _numpy_version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_numpy_version VERSION_GREATER_EQUAL 2 AND pybind11_VERSION VERSION_LESS 2.12)
      message(FATAL_ERROR
        "packsched: numpy ${_numpy_version} needs pybind11 >= 2.12, found ${pybind11_VERSION} "
        "(${pybind11_DIR}); pip install 'pybind11>=2.12' into ${Python_EXECUTABLE}'s environment")
    endif()
  endif()
  if((NOT Python_FOUND OR NOT pybind11_FOUND) AND SKBUILD)
    # A wheel is the Python package: without it there is nothing to build.
    message(FATAL_ERROR "packsched: a wheel build needs Python (its headers) and pybind11")
  elseif(NOT Python_FOUND OR NOT pybind11_FOUND)
    message(STATUS "packsched: Python or pybind11 not found, Python package off")
    set(PACKSCHED_WITH_PYTHON OFF)
  endif()
endif()
