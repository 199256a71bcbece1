#!/bin/sh
# Re-record the reference profile and traces of this folder in one go: the profile, then every
# trace three times, interleaved (round 1: dp2 pp2 tp2 t5, round 2: ..., a minute or so apart),
# keeping each trace's median run (validate/median_run.py: chosen by its measured median
# iteration, before anything is predicted). Run from anywhere with the venv active; pick a
# quiet moment (the load average is printed before and after, and each file records its own).
# Takes about three minutes on 2 cores. Nothing here is replaced unless every step succeeds.
set -e
cd "$(dirname "$0")"
uptime
rounds=$(mktemp -d)
trap 'rm -rf "$rounds"' EXIT
sim profile --device cpu --model tiny-gpt,tiny-t5 --out "$rounds/profile.csv" --warmup 3 \
    --repeats 10
for round in 1 2 3; do
    for plan in dp2 pp2 tp2; do
        sim trace --model tiny-gpt --plan "$plan" --iterations 10 --warmup 3 \
            --out "$rounds/tiny-gpt-$plan.$round.json"
    done
    sim trace --model tiny-t5 --plan dp2 --iterations 10 --warmup 3 \
        --out "$rounds/tiny-t5-dp2.$round.json"
done
for name in tiny-gpt-dp2 tiny-gpt-pp2 tiny-gpt-tp2 tiny-t5-dp2; do
    python -m trainsim.validate.median_run "$rounds/$name.json" "$rounds/$name".1.json \
        "$rounds/$name".2.json "$rounds/$name".3.json
done
for name in profile.csv tiny-gpt-dp2.json tiny-gpt-pp2.json tiny-gpt-tp2.json tiny-t5-dp2.json; do
    mv -f "$rounds/$name" "$name"
done
uptime
