#!/bin/sh
# Re-record the reference profile and traces of this folder, one after the other, in one go.
# Run from anywhere with the venv active; pick a quiet moment (the load average is printed
# before and after, and each file records its own). Takes about five minutes on 2 cores.
set -e
cd "$(dirname "$0")"
uptime
sim profile --device cpu --model tiny-gpt,tiny-t5 --out profile.csv --warmup 3 --repeats 10 --force
for plan in dp2 pp2 tp2; do
    sim trace --model tiny-gpt --plan "$plan" --iterations 10 --warmup 3 --out "tiny-gpt-$plan.json" --force
done
sim trace --model tiny-t5 --plan dp2 --iterations 10 --warmup 3 --out tiny-t5-dp2.json --force
uptime
