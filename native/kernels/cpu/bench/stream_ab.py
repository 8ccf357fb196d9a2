"""Streaming GEMV A/B of avx2 vs avx512vnni (issue 13): one call over a ~128 MiB weight stack
(K = 576, far beyond L2; the regime of a decode step), nvfp4_x4 / w4a8 / w8a8, 1 and 2 threads
(rows split in halves), 8 alternating rounds, best per ISA. Run from the repository root:
  .venv/bin/python native/kernels/cpu/bench/stream_ab.py
"""
import numpy as np, time, sys
sys.path.insert(0,'.')
from app.bench import kernels as kb
k=kb._kernels()
rng=np.random.default_rng(0)
K=576
def w8(N):
    return dict(data=rng.integers(-127,128,(N,K),dtype=np.int8), scales=(rng.random((N,K//32),dtype=np.float32)*0.01+0.01).astype(np.float16))
cells=[]
for fmt in ("nvfp4_x4","w4a8","w8a8"):
    if fmt=="w8a8":
        N=128*2**20//612//16*16; w=w8(N); nb=sum(v.nbytes for v in w.values())
    else:
        _,rb=kb._random_weights(k,fmt,16,K,rng); N=128*2**20*16//rb//16*16; w,nb=kb._random_weights(k,fmt,N,K,rng)
    x=rng.standard_normal((1,K),dtype=np.float32)
    for threads in (1,2):
        best={}
        for r in range(8):
            for isa in (("avx2","avx512vnni") if r%2==0 else ("avx512vnni","avx2")):
                k.set_kernel_isa(isa)
                if fmt=="w8a8":
                    def call(n0=0,n1=None,reps=1): return k.gemm("w8a8",w["data"],x,scales=w["scales"],repeat=reps,n0=n0,n1=n1)
                    if threads==1:
                        t0=time.perf_counter(); call(); s=time.perf_counter()-t0
                    else:
                        import threading
                        cut=[0,N//2//16*16,N]; b=threading.Barrier(3)
                        def work(i): b.wait(); call(cut[i],cut[i+1])
                        ts=[threading.Thread(target=work,args=(i,)) for i in range(2)]
                        [t.start() for t in ts]; b.wait(); t0=time.perf_counter(); [t.join() for t in ts]; s=time.perf_counter()-t0
                    s=min(s, s)
                else:
                    s=kb._timed(k,fmt,w,x,1,threads)
                best[isa]=min(best.get(isa,9e9),s)
        print(fmt,f"{threads}T N={N}", " ".join(f"{i} {nb/best[i]/1e9:.1f} GB/s" for i in ("avx2","avx512vnni")), f"ratio {best['avx2']/best['avx512vnni']:.3f}", flush=True)
