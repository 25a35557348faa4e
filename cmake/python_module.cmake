# `import meshtrain`: the pybind11 extension (src/python/*.cc, over the command line's library
# and the engine) and the package around it (python/meshtrain/), laid out together in
# <build>/python/meshtrain so that PYTHONPATH=<build>/python finds them (docs/python.md).
#
# The interpreter is Debian's /usr/bin/python3 where it exists: the one whose NumPy and
# PyTorch the tests compare against (a pyenv or venv python3 earlier on PATH would build a
# module that Debian's interpreter cannot import). -DPython_EXECUTABLE=... chooses another.
# MESHTRAIN_PYTHON=OFF builds no module; without it, a missing pybind11 (Debian's
# pybind11-dev, which scripts/setup.sh installs) is an error rather than tests quietly absent.
option(MESHTRAIN_PYTHON "Build the Python module (needs pybind11-dev and python3-dev)" ON)
if(NOT MESHTRAIN_PYTHON)
  return()
endif()
if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3)
endif()
set(PYBIND11_FINDPYTHON ON)
find_package(Python COMPONENTS Interpreter Development.Module)
find_package(pybind11 CONFIG QUIET)
if(NOT pybind11_FOUND OR NOT Python_FOUND)
  message(FATAL_ERROR "meshtrain: the Python module needs pybind11 and the Python headers (apt install "
                      "pybind11-dev python3-dev, as scripts/setup.sh does), or -DMESHTRAIN_PYTHON=OFF")
endif()

# No link-time optimisation (pybind11's default for a release module): the engine's libraries
# are not built for it, and the module's own sources gain nothing worth a slower link.
set(CMAKE_INTERPROCEDURAL_OPTIMIZATION OFF)
file(GLOB PYTHON_BINDING_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/python/*.cc)
pybind11_add_module(meshtrain_python MODULE ${PYTHON_BINDING_SOURCES})
set(MESHTRAIN_PYTHON_DIR ${CMAKE_BINARY_DIR}/python/meshtrain)
set_target_properties(meshtrain_python PROPERTIES OUTPUT_NAME _meshtrain
                      LIBRARY_OUTPUT_DIRECTORY ${MESHTRAIN_PYTHON_DIR})
target_link_libraries(meshtrain_python PRIVATE meshtrain_cli)
# The command, for runs on several ranks (the launcher starts them as `meshtrain train`).
target_compile_definitions(meshtrain_python PRIVATE MESHTRAIN_BINARY="$<TARGET_FILE:meshtrain>")
add_dependencies(meshtrain_python meshtrain)
# The package's Python files beside the extension, copied on every build (a few files).
file(GLOB PYTHON_PACKAGE_FILES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/meshtrain/*)
add_custom_target(meshtrain_python_files ALL
                  COMMAND ${CMAKE_COMMAND} -E make_directory ${MESHTRAIN_PYTHON_DIR}
                  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${PYTHON_PACKAGE_FILES} ${MESHTRAIN_PYTHON_DIR}
                  DEPENDS ${PYTHON_PACKAGE_FILES}
                  COMMENT "meshtrain: the Python package's files into ${MESHTRAIN_PYTHON_DIR}")

# The module's tests (pytest, Debian's python3-pytest), with the interpreter that built it.
add_test(NAME python COMMAND ${Python_EXECUTABLE} -m pytest -q -p no:cacheprovider ${CMAKE_SOURCE_DIR}/tests/python)
set_tests_properties(python PROPERTIES TIMEOUT 600 ENVIRONMENT
                     "PYTHONPATH=${CMAKE_BINARY_DIR}/python;OMP_NUM_THREADS=2;MESHTRAIN_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
