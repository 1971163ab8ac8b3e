"""One module per `locojax` subcommand, each exposing `main(argv)` (`cli.py` dispatches).

    train.py               `locojax train`: a GRPO run
    demo.py                `locojax demo`: the embedded default run (`--real`: SmolLM2)
    launch.py              `locojax launch`: a subcommand as N local hosts
    eval.py                `locojax eval`: a checkpoint scored on a task
    eval_groups.py         eval's rows grouped by prompt length
    curate.py              `locojax curate`: keep the prompts that can teach
    sft.py                 `locojax sft`: a char-level starting checkpoint
    generate.py            `locojax generate`: sample with the engine, tokens/s
    convert.py             `locojax convert`: a GGUF file to an HF checkpoint
    plot.py                `locojax plot`: one PNG of a run
    devices.py             `locojax devices`: what each host sees, a cross-host all-reduce
    predict.py             `locojax predict`: memory, step time and placement before launch
    predict_train.py       `predict train ARGS`: a train command line as the cost model's inputs
    predict_fields.py      `predict fields`: which train fields it reads (predict_fields.json)
    predict_report.py      what `locojax predict` prints: its tables, throughput, constants
    predict_calibrate.py   `locojax predict calibrate`: measure this machine
"""
