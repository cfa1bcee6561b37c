# `import qq` then `import torch` in fresh interpreters, variants (session r: the crash that libqq's exported libstdc++ caused; logs-2026-11-27r/import_order/)
P=python3
run() { echo "--- $1"; timeout 300 $P -X faulthandler -c "$2" 2>&1 | head -${3:-14}; echo "rc=${PIPESTATUS[0]}"; }
run "import qq, torch" "import qq, torch; print('ok')" 30
run "pathfinder cublasLt preload, then torch (no qq)" "from cuda.pathfinder import load_nvidia_dynamic_lib as l; d=l('cublasLt'); print(d.abs_path, d.was_already_loaded_from_elsewhere if hasattr(d,'was_already_loaded_from_elsewhere') else ''); import torch; print('ok')"
run "import cuda.pathfinder, then torch" "import cuda.pathfinder; import torch; print('ok')"
run "qq with the preload disabled, then torch" "import cuda.pathfinder as p; p.load_nvidia_dynamic_lib=lambda n: None; import qq, torch; print('ok', qq.build_info().get('cublaslt_preload'))"
run "qq._qq alone (no preload), then torch: maps" "import cuda.pathfinder as p; p.load_nvidia_dynamic_lib=lambda n: None; import qq, torch; print([l.split()[-1] for l in open('/proc/self/maps') if 'cublas' in l or 'cudart' in l][:20:2])"
run "torch first: where its cublasLt comes from" "import torch; torch.ones(2,device='cuda')@torch.ones(2,device='cuda'); print(sorted(set(l.split()[-1] for l in open('/proc/self/maps') if 'cublas' in l or 'cudart' in l or 'nvrtc' in l)))"
run "qq first: what it loaded" "import qq; print(sorted(set(l.split()[-1] for l in open('/proc/self/maps') if 'cublas' in l or 'cudart' in l or 'nvrtc' in l or 'stdc++' in l or 'gomp' in l)))"
run "torch first: stdc++/gomp" "import torch; print(sorted(set(l.split()[-1] for l in open('/proc/self/maps') if 'stdc++' in l or 'gomp' in l)))"
pip list 2>/dev/null | grep -i -E "nvidia|cuda|^torch |numpy"
ls -la /usr/local/cuda/lib64/libcublasLt.so* 2>&1 | head
python3 -c "import torch; print(torch.__version__, torch.version.cuda)"
