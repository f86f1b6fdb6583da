set -x
G="--device cpu -b 8 -e 8 --paths sync,async_wait,future_then --calls 400 --blocks 30 --pin-cpu --progress off"
export OMP_NUM_THREADS=1
cd /work/main && nice /work/main/.venv/bin/python bench/percall.py $G --runs 5 --json /tmp/d1pc/main.json
cd /work/wt/d1 && nice .venv/bin/python bench/percall.py $G --runs 5 --json /tmp/d1pc/d1.json --compare /tmp/d1pc/main.json --max-added-us 2
cd /work/main && nice /work/main/.venv/bin/python bench/percall.py $G --runs 5 --json /tmp/d1pc/main2.json --compare /tmp/d1pc/d1.json --max-added-us 2
