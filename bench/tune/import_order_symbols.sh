# The import-order crash bisected: libqq.so alone, RTLD flags, its exported symbols and the bindings into it (session r; logs-2026-11-27r/import_order/)
P=python3
LIBQQ=$($P -c "import qq; print([l.split()[-1] for l in open('/proc/self/maps') if 'libqq.so' in l][0])")
QQEXT=$($P -c "import qq._qq as m; print(m.__file__)")
echo "libqq: $LIBQQ"; echo "ext: $QQEXT"
run() { echo "--- $1"; timeout 300 $P -X faulthandler -c "$2" 2>&1 | head -${3:-6}; echo "rc=${PIPESTATUS[0]}"; }
run "libqq.so alone (dlopen, RTLD_LOCAL), then torch" "import ctypes; ctypes.CDLL('$LIBQQ'); import torch; print('ok')"
run "libqq.so RTLD_GLOBAL, then torch" "import ctypes, os; ctypes.CDLL('$LIBQQ', mode=os.RTLD_GLOBAL); import torch; print('ok')"
run "numpy + cuda.pathfinder + ctypes, then torch" "import numpy, ctypes, cuda.pathfinder; import torch; print('ok')"
run "import qq, then torch with RTLD_LOCAL forced" "import sys, os; import qq; sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL); import torch; print('ok')"
echo "--- dlopen flags at start"; $P -c "import sys; print(sys.getdlopenflags())"
echo "--- libqq dynamic symbols (defined): by binding"
readelf -W --dyn-syms "$LIBQQ" | awk '$7!="UND" && NR>3 {print $5}' | sort | uniq -c
readelf -W --dyn-syms "$LIBQQ" | awk '$7!="UND" && ($5=="UNIQUE" || $5=="WEAK") {print $5, $8}' | c++filt | head -40
readelf -W --dyn-syms "$LIBQQ" | awk '$7!="UND" && $5=="GLOBAL" {print $8}' | c++filt | grep -v "^qq" | head -40
echo "--- ext dynamic symbols"
readelf -W --dyn-syms "$QQEXT" | awk '$7!="UND" && NR>3 {print $5, $8}' | c++filt | head -20
echo "--- bindings into qq's libraries from other objects"
LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/ldb $P -c "import qq, torch" > /dev/null 2>&1
cat /tmp/ldb.* | grep "binding file" | grep -E "to (.*libqq|.*_qq)" | grep -v -E "binding file (.*libqq|.*_qq)" | sed -E 's/^ *[0-9]+: *//' | awk '{print $3, $5, $NF}' | sort | uniq -c | sort -rn | head -40
readelf -d "$LIBQQ" | grep -E "NEEDED|RUNPATH|RPATH|SONAME"
