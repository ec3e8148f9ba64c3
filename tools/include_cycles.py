#!/usr/bin/env python3
"""include_cycles.py — the include cycles between modules of src/ (run from the repository root).

A module is x.c + x.h under src/ (its path without the extension); an edge A -> B is an
#include "B.h" in A.c or A.h. A header without a .c file of its own (an internal header such as
cpu_internal.h or http_api_internal.h) is folded into its users: including it counts as including
what it includes. Prints each strongly connected component of more than one module, then the count;
exits 1 when there is a cycle.
"""
import os,re,sys,collections
root='src'
mods=collections.defaultdict(set)  # module -> files
inc=collections.defaultdict(set)
files=[]
for d,_,fs in os.walk(root):
    for f in fs:
        if f.endswith(('.c','.h')): files.append(os.path.join(d,f))
def mod(path):
    rel=os.path.relpath(path,root); return os.path.splitext(rel)[0]
allmods={mod(f) for f in files}
# header-only internal headers fold into users: treat header without .c as part of... keep simple: own module
for f in files:
    m=mod(f)
    for line in open(f,errors='replace'):
        r=re.match(r'\s*#\s*include\s+"([^"]+)"',line)
        if r:
            t=os.path.splitext(r.group(1))[0]
            if t in allmods and t!=m: inc[m].add(t)
# header-only modules fold into their users: edges through them are contracted
hdr_only={m for m in allmods if not os.path.exists(os.path.join(root,m+'.c'))}
def eff(m,seen=None):
    out=set(); seen=seen or set()
    for t in inc[m]:
        if t in hdr_only:
            if t in seen: continue
            seen.add(t); out|=eff(t,seen)
        else: out.add(t)
    return out
inc2={m:eff(m)-{m} for m in allmods if m not in hdr_only}
inc=collections.defaultdict(set,inc2)
allmods={m for m in allmods if m not in hdr_only}
# tarjan SCC
index={};low={};st=[];on=set();sccs=[];i=[0]
sys.setrecursionlimit(10000)
def sc(v):
    index[v]=low[v]=i[0];i[0]+=1;st.append(v);on.add(v)
    for w in inc[v]:
        if w not in index: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],index[w])
    if low[v]==index[v]:
        c=[]
        while True:
            w=st.pop();on.discard(w);c.append(w)
            if w==v:break
        if len(c)>1: sccs.append(sorted(c))
for v in sorted(allmods):
    if v not in index: sc(v)
for c in sccs: print('cycle:',' <-> '.join(c))
print(len(sccs),'cycles')
sys.exit(1 if sccs else 0)
