#!/bin/sh
# Runs Python test modules with pytest under a Python that has numpy and
# pytest (Debian's python3-numpy, python3-pytest); exit 77 (CTest: skipped)
# without one. Usage: pytest.sh STZ MODULE...
STZ=$1
shift
for py in /usr/bin/python3 python3; do
    if command -v "$py" >/dev/null && "$py" -c "import numpy, pytest" 2>/dev/null; then
        STZ=$STZ PYTHONDONTWRITEBYTECODE=1 exec "$py" -m pytest -q -p no:cacheprovider "$@"
    fi
done
echo "skip: no Python with numpy and pytest (apt-get install python3-numpy python3-pytest)"
exit 77
