"""The powered DPN study: DPN vs the conv stem on real data at two patch sizes and two schedule
lengths with >= 5 seeds, a plateau check, and Table 6's stem ablations; params in study/params.yaml,
pipeline in study/dvc.yaml, report in reports/study.md."""
