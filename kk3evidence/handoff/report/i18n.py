"""Texts of the hand-off report in English and Korean (``--lang ko``).

The Korean follows the wording of the guide the product comes from (seed: "재현 인계 점검"), so
the teams it was written for read their own checklist back. Dynamic parts use ``str.format``
fields; every key must exist in both languages (a test checks it).
"""

from __future__ import annotations

from typing import Literal

Lang = Literal["en", "ko"]
LANGS: tuple[Lang, ...] = ("en", "ko")

# The guide's 11-item hand-off checklist, in its order: (key, English, Korean original).
CHECKLIST: tuple[tuple[str, str, str], ...] = (
    (
        "driver_cuda_same_time",
        "Host driver and the container's CUDA information saved at the same time",
        "호스트 드라이버와 컨테이너 내부 CUDA 정보를 같은 시각에 저장했습니다.",
    ),
    (
        "image_id",
        "Image identifier recorded, not only the image tag",
        "이미지 태그뿐 아니라 이미지 식별자도 기록했습니다.",
    ),
    (
        "minimal_command",
        "Business extra arguments separated from the actual start command",
        "실제 시작 명령에서 업무용 추가 인자를 분리했습니다.",
    ),
    (
        "first_error_kept",
        "First error stack and the log just before it preserved",
        "첫 번째 오류 스택과 오류 직전 로그를 보존했습니다.",
    ),
    ("fixed_request", "Fixed input and output cap used", "고정 입력과 출력 상한을 사용했습니다."),
    (
        "single_vs_load",
        "Single-request success kept apart from load testing",
        "단일 요청 성공 여부를 부하 테스트와 구분했습니다.",
    ),
    (
        "one_variable",
        "Only one variable changed in this round",
        "한 회차에 하나의 변수만 변경했습니다.",
    ),
    (
        "reverted_baseline",
        "Went back to the last stable baseline when the error changed",
        "오류가 바뀌면 직전 안정 기준선으로 되돌렸습니다.",
    ),
    (
        "prefix_caching",
        "Prefix caching verified explicitly, in a separate step",
        "prefix caching을 별도 단계에서 명시적으로 검증했습니다.",
    ),
    (
        "repro_limits",
        "Reproducibility limits and online scheduling effects written in the hand-off",
        "재현성의 한계와 온라인 스케줄링 영향을 인계 문서에 적었습니다.",
    ),
    (
        "cluster_state",
        "Other jobs and GPU occupancy on the original cluster recorded",
        "원래 클러스터의 다른 작업과 GPU 점유 상태를 기록했습니다.",
    ),
)

_CATALOG: dict[str, tuple[str, str]] = {
    # --- headings -----------------------------------------------------------------------
    "title": ("Hand-off: vLLM start-up evidence", "인계 문서: vLLM 시작 실패 재현 증거"),
    "h_summary": ("Summary", "요약"),
    "h_fingerprint": ("Environment fingerprint", "환경 지문"),
    "h_command": ("Minimal start command", "최소 시작 명령"),
    "h_request": ("Fixed request and response", "고정 요청과 응답"),
    "h_failure": ("First failing stage", "첫 실패 단계"),
    "h_timeline": ("Stage timeline", "단계별 진행"),
    "h_baseline": ("Single-variable result against the baseline", "기준선 대비 단일 변수 결과"),
    "h_compat": ("Official compatibility boundaries", "공식 호환 경계"),
    "h_checklist": ("Hand-off checklist", "재현 인계 점검"),
    "h_limits": ("Reproducibility limits", "재현성의 한계"),
    "h_bundle": ("About this evidence", "이 증거에 대하여"),
    # --- summary ------------------------------------------------------------------------
    "sum_failed": (
        "The server failed in stage **{stage}** (category **{category}**, rule {rule}) at log "
        "line {line_no}{process}. The last stage reached was {last}.",
        "서버는 **{stage}** 단계에서 실패했습니다 (분류 **{category}**, 규칙 {rule}, 로그 "
        "{line_no}번째 줄{process}). 마지막으로 도달한 단계는 {last}입니다.",
    ),
    "sum_ok_ready": (
        "The server started (API ready after {ready}) and answered the fixed request with HTTP "
        "{status}. No failure was found in the log.",
        "서버가 시작되었고 ({ready} 후 API 준비 완료) 고정 요청에 HTTP {status}로 응답했습니다. "
        "로그에서 실패는 발견되지 않았습니다.",
    ),
    "sum_ok_noreq": (
        "No failure was found in the log; the last stage reached was {last}.",
        "로그에서 실패는 발견되지 않았습니다. 마지막으로 도달한 단계는 {last}입니다.",
    ),
    "sum_exit": ("The command exited with status {code}.", "명령의 종료 코드는 {code}입니다."),
    "sum_model": ("Model: `{model}`; bundle `{bundle}`.", "모델: `{model}`; 번들 `{bundle}`."),
    "process": (", process {process}", ", 프로세스 {process}"),
    "unknown": ("unknown", "알 수 없음"),
    "none": ("none", "없음"),
    "not_recorded": ("not recorded", "기록 없음"),
    # --- fingerprint rows -------------------------------------------------------------------
    "fp_item": ("Item", "항목"),
    "fp_value": ("Value", "값"),
    "fp_where": ("Where it came from", "출처"),
    "fp_host": ("Host (kernel, OS, arch)", "호스트 (커널, OS, 아키텍처)"),
    "fp_cpu": ("CPUs, memory", "CPU, 메모리"),
    "fp_gpus": ("GPUs", "GPU 목록"),
    "fp_driver": ("NVIDIA driver", "NVIDIA 드라이버"),
    "fp_cuda_driver": ("CUDA version of the driver (NVML)", "드라이버의 CUDA 버전 (NVML)"),
    "fp_runtime": ("Container runtime", "컨테이너 런타임"),
    "fp_image_ref": ("Image reference (tag)", "이미지 태그"),
    "fp_image_id": ("Image id", "이미지 식별자"),
    "fp_python": ("Python", "Python"),
    "fp_vllm": ("vLLM", "vLLM"),
    "fp_torch": ("PyTorch", "PyTorch"),
    "fp_torch_cuda": ("torch.version.cuda", "torch.version.cuda"),
    "fp_nccl": ("NCCL", "NCCL"),
    "fp_visible": ("GPUs visible to torch", "torch가 보는 GPU 수"),
    "fp_libs": ("Libraries loaded by the server", "서버가 실제로 읽은 라이브러리"),
    "fp_env": ("Environment variables", "환경 변수"),
    "fp_collected": ("Collected at", "수집 시각"),
    "fp_in_use": ("in use {size}", "사용 중 {size}"),
    "fp_cpu_value": ("{n} CPUs, {mem}", "CPU {n}개, {mem}"),
    "line_no": ("line {n}", "{n}번째 줄"),
    "warning": (" (warning)", " (경고)"),
    "fp_no_gpu": ("none (NVML: {source})", "없음 (NVML: {source})"),
    # --- command ------------------------------------------------------------------------
    "cmd_as_run": ("Command as run (secrets redacted):", "실제로 실행한 명령 (비밀값 가림):"),
    "cmd_minimal": (
        "Minimal command (only what starting the engine needs):",
        "최소 명령 (엔진 시작에 필요한 인자만):",
    ),
    "cmd_is_minimal": (
        "The command carries no feature flags beyond what start-up needs: it is already the "
        "minimal command.",
        "시작에 필요한 인자 외의 기능 인자가 없습니다. 이미 최소 명령입니다.",
    ),
    "cmd_removed": (
        "Left out of the minimal command (restore one per round, as `kk3evidence minimize` "
        "plans it):",
        "최소 명령에서 뺀 인자 (`kk3evidence minimize` 계획처럼 회차마다 하나씩 복구):",
    ),
    "cmd_none": ("No launch command in the bundle.", "번들에 시작 명령이 없습니다."),
    # --- request ------------------------------------------------------------------------
    "req_none": (
        "No request was sent: the server did not reach `api_ready`.",
        "요청을 보내지 않았습니다: 서버가 `api_ready` 단계에 도달하지 못했습니다.",
    ),
    "req_line": (
        "`{method} {path}` → HTTP {status} in {latency}",
        "`{method} {path}` → HTTP {status}, {latency} 소요",
    ),
    "req_body": ("Request body:", "요청 본문:"),
    "req_response": ("Response (excerpt):", "응답 (발췌):"),
    "req_usage": (
        "Usage: {usage}; cached_tokens: {cached}",
        "사용량: {usage}; cached_tokens: {cached}",
    ),
    "req_cached_unknown": (
        "unknown (absent; vLLM reports it only with --enable-prompt-tokens-details)",
        "알 수 없음 (값 없음; --enable-prompt-tokens-details일 때만 보고됨)",
    ),
    "req_error": ("Error: {error}", "오류: {error}"),
    "req_more": ("{n} more request(s) in the bundle: {names}", "번들에 요청 {n}개 더: {names}"),
    # --- failure ------------------------------------------------------------------------
    "fail_none": (
        "No failure found. Last stage reached: {last}.",
        "실패가 발견되지 않았습니다. 마지막 도달 단계: {last}.",
    ),
    "fail_fields": (
        "Stage **{stage}**, category **{category}**, rule `{rule}`, log line {line_no}{process}.",
        "단계 **{stage}**, 분류 **{category}**, 규칙 `{rule}`, 로그 {line_no}번째 줄{process}.",
    ),
    "fail_lines": (
        "Evidence lines (the first causal line is marked `>>`):",
        "근거 로그 (첫 원인 줄은 `>>`로 표시):",
    ),
    "fail_conseq": (
        "{n} later line(s) only report this failure (consequences), e.g.:",
        "이후 {n}개 줄은 이 실패를 다시 알리는 후속 현상입니다. 예:",
    ),
    "fail_note": (
        "Later errors (OOM, cleanup, 'Engine core initialization failed') are consequences of "
        "this first failure; fix this one first.",
        "뒤에 나오는 오류(OOM, 정리 중 오류, 'Engine core initialization failed')는 이 첫 실패의 "
        "후속 현상입니다. 이것부터 해결하십시오.",
    ),
    "tl_stage": ("Stage", "단계"),
    "tl_status": ("Status", "상태"),
    "tl_lines": ("Log lines", "로그 줄"),
    "tl_time": ("Time from launch", "시작 후 시간"),
    "tl_duration": ("Time in stage", "단계 소요 시간"),
    "fail_stall": (
        "No line states a failure: the start-up stopped moving (a hang). Where and since when, "
        "which ranks reached which milestone, and what each process was waiting in:",
        "실패를 알리는 줄이 없습니다. 시작이 멈췄습니다(hang). 멈춘 위치와 시각, 랭크별 도달 "
        "단계, 각 프로세스가 기다리던 곳:",
    ),
    "tl_none": ("No stage was recognised in the log.", "로그에서 인식된 단계가 없습니다."),
    "tl_ready": ("API ready", "API 준비"),
    "tl_first_failure": ("first failure", "첫 실패"),
    "tl_axis_s": ("seconds from launch", "시작 후 초"),
    "tl_axis_l": ("log line", "로그 줄"),
    # --- baseline -----------------------------------------------------------------------
    "base_none": (
        "No baseline given (`--baseline BUNDLE`): whether only one variable changed cannot be "
        "judged from this bundle alone.",
        "기준선이 주어지지 않았습니다 (`--baseline BUNDLE`). 이 번들만으로는 변수가 하나만 "
        "바뀌었는지 판단할 수 없습니다.",
    ),
    "base_against": (
        "Against baseline `{baseline}`: {summary}.",
        "기준선 `{baseline}` 대비: {summary}.",
    ),
    "base_verdict_none": ("no variable changed", "바뀐 변수 없음"),
    "base_verdict_one": (
        "exactly one variable changed: {names}",
        "정확히 하나의 변수만 바뀜: {names}",
    ),
    "base_verdict_several": ("{n} variables changed: {names}", "{n}개 변수가 바뀜: {names}"),
    "base_changes": ("Variables:", "바뀐 변수:"),
    "base_follow": ("Follow-on differences (not counted):", "따라서 달라진 항목 (세지 않음):"),
    "base_outcome": ("Outcome difference:", "결과 차이:"),
    "base_same_outcome": (
        "Same outcome as the baseline (first failure, last stage, exit code).",
        "결과는 기준선과 같습니다 (첫 실패, 마지막 단계, 종료 코드).",
    ),
    "base_several_hint": (
        "Several variables moved at once: the cause cannot be attributed. Go back to the "
        "baseline and change one at a time.",
        "여러 변수가 동시에 움직였으므로 원인을 특정할 수 없습니다. 기준선으로 돌아가 한 번에 "
        "하나씩 바꾸십시오.",
    ),
    # --- compat ---------------------------------------------------------------------------
    "compat_recipe": ("Recipe: {recipe}{auto}.", "레시피: {recipe}{auto}."),
    "compat_auto": (" (picked from the served model)", " (서비스 모델에서 자동 선택)"),
    "compat_generic": (
        "Generic rules only (no recipe matched).",
        "일반 규칙만 적용 (맞는 레시피 없음).",
    ),
    "compat_rule": ("Rule", "규칙"),
    "compat_result": ("Result", "결과"),
    "compat_why": ("Why", "이유"),
    "compat_source": ("Source", "출처"),
    # --- checklist ----------------------------------------------------------------------
    "ck_item": ("Item", "항목"),
    "ck_result": ("Result", "결과"),
    "ck_why": ("Evidence", "근거"),
    "pass": ("pass", "통과"),
    "fail": ("fail", "미흡"),
    "unknown_status": ("unknown", "판단 불가"),
    "ck_counts": ("{p} pass, {f} fail, {u} unknown.", "통과 {p}, 미흡 {f}, 판단 불가 {u}."),
    "ck_gate": (
        "Move on to CUDA, OOM, communication or cache fixes only once every item passes.",
        "이 체크리스트를 모두 통과한 뒤에야 CUDA, OOM, 통신 또는 캐시 관련 수정으로 넘어갑니다.",
    ),
    # checklist reasons
    "ck1_pass": (
        "driver {driver} and torch.version.cuda {cuda} are in one fingerprint taken at {at}",
        "드라이버 {driver}와 torch.version.cuda {cuda}가 같은 지문({at})에 함께 저장되었습니다",
    ),
    "ck1_fail_cuda": (
        "the driver ({driver}) is recorded but the container's CUDA runtime is not "
        "(no torch.version.cuda, no libcudart)",
        "드라이버({driver})는 기록되었지만 컨테이너의 CUDA 런타임 정보(torch.version."
        "cuda, libcudart)가 없습니다",
    ),
    "ck1_fail_driver": (
        "the container CUDA ({cuda}) is recorded but not the host driver (NVML: {source})",
        "컨테이너 CUDA({cuda})는 기록되었지만 호스트 드라이버가 없습니다 (NVML: {source})",
    ),
    "ck1_unknown": (
        "no NVIDIA GPU in this run (NVML: {source}); nothing to pair",
        "이 실행에는 NVIDIA GPU가 없습니다 (NVML: {source}). 비교할 정보가 없습니다",
    ),
    "ck2_pass": ("image id {image_id} ({how})", "이미지 식별자 {image_id} ({how})"),
    "ck2_fail": (
        "only the tag {ref} is recorded; record the image id (docker inspect "
        "--format '{{{{.Id}}}}')",
        "태그 {ref}만 기록되었습니다. 이미지 식별자를 기록하십시오 (docker inspect "
        "--format '{{{{.Id}}}}')",
    ),
    "ck2_fail_none": (
        "a {runtime} container was detected but neither its image tag nor its image id was "
        "recorded; give them to capture (--image, --image-id)",
        "{runtime} 컨테이너가 감지되었지만 이미지 태그도 이미지 식별자도 기록되지 않았습니다. "
        "capture에 --image, --image-id로 알려 주십시오",
    ),
    "ck2_unknown": (
        "no container detected (runtime: {runtime}); the Python environment is "
        "fingerprinted instead",
        "컨테이너가 감지되지 않았습니다 (런타임: {runtime}). 대신 Python 환경을 "
        "지문으로 남겼습니다",
    ),
    "ck3_pass": (
        "the command has no feature flags beyond start-up ({n} flags)",
        "시작에 필요한 것 외의 기능 인자가 없습니다 (인자 {n}개)",
    ),
    "ck3_fail": (
        "feature flags still in the start command: {flags}",
        "시작 명령에 기능 인자가 남아 있습니다: {flags}",
    ),
    "ck3_unknown": ("no launch argv in the bundle", "번들에 시작 명령이 없습니다"),
    "ck4_pass": (
        "the whole log is in the bundle ({lines} lines, first failure at line "
        "{line_no} with {before} lines before it)",
        "전체 로그가 번들에 있습니다 ({lines}줄, 첫 실패는 {line_no}번째 줄, 그 앞 "
        "{before}줄 보존)",
    ),
    "ck4_pass_ok": (
        "the whole log is in the bundle ({lines} lines); no failure occurred",
        "전체 로그가 번들에 있습니다 ({lines}줄). 실패는 없었습니다",
    ),
    "ck4_fail_loss": ("the log is incomplete: {loss}", "로그가 불완전합니다: {loss}"),
    "ck4_fail_missing": ("logs/combined.log is missing", "logs/combined.log가 없습니다"),
    "ck5_pass": (
        "fixed request with max_tokens={cap}, temperature={temp}, input of {chars} characters",
        "고정 요청 사용: max_tokens={cap}, temperature={temp}, 입력 {chars}자",
    ),
    "ck5_fail": (
        "the request has no output cap (max_tokens)",
        "요청에 출력 상한(max_tokens)이 없습니다",
    ),
    "ck5_unknown": (
        "no request was sent (the server did not become ready)",
        "요청을 보내지 않았습니다 (서버가 준비되지 않음)",
    ),
    "ck6_pass": (
        "one fixed request recorded on its own ({n} request(s) in total, no load run mixed in)",
        "고정 요청 하나를 따로 기록했습니다 (전체 {n}개, 부하 요청 섞이지 않음)",
    ),
    "ck6_pass_both": (
        "the fixed request is recorded apart from {k} concurrency request(s)",
        "고정 요청을 동시성 요청 {k}개와 구분해 기록했습니다",
    ),
    "ck6_fail": (
        "only concurrent requests were sent; no single fixed request",
        "동시 요청만 있고 단일 고정 요청이 없습니다",
    ),
    "ck7_pass": ("against the baseline: {summary}", "기준선 대비: {summary}"),
    "ck7_fail": ("against the baseline: {summary}", "기준선 대비: {summary}"),
    "ck7_notes_pass": (
        "notes.json records one change: {change}",
        "notes.json에 변경 하나가 기록되어 있습니다: {change}",
    ),
    "ck7_notes_fail": (
        "notes.json records {n} changes in this round: {changes}",
        "notes.json에 이번 회차의 변경이 {n}개 기록되어 있습니다: {changes}",
    ),
    "ck7_unknown": (
        "no baseline given and no change recorded in notes.json",
        "기준선이 없고 notes.json에도 변경 기록이 없습니다",
    ),
    "ck8_pass_baseline": (
        "this run is one variable away from a baseline that started cleanly",
        "이 실행은 정상 시작한 기준선에서 변수 하나만 다릅니다",
    ),
    "ck8_pass_notes": (
        "notes.json records a return to the baseline: {note}",
        "notes.json에 기준선 복귀가 기록되어 있습니다: {note}",
    ),
    "ck8_fail": (
        "the baseline itself failed ({stage}/{category}); go back to the last run that "
        "started cleanly before changing more",
        "기준선 자체가 실패했습니다 ({stage}/{category}). 더 바꾸기 전에 마지막으로 정상 "
        "시작한 실행으로 되돌리십시오",
    ),
    "ck8_unknown": (
        "needs the run history: give --baseline with the last stable run or record "
        "the return in notes.json",
        "실행 이력이 필요합니다. 마지막 안정 실행을 --baseline으로 주거나 notes.json에 "
        "복귀를 기록하십시오",
    ),
    "ck9_pass_diff": (
        "--enable-prefix-caching is the only change against the baseline",
        "기준선 대비 유일한 변경이 --enable-prefix-caching입니다",
    ),
    "ck9_pass_metrics": (
        "prefix caching enabled explicitly; /metrics shows {hits} hits of {queries} queried tokens",
        "prefix caching을 명시적으로 켰고 /metrics에서 조회 토큰 {queries}개 중 "
        "{hits}개 적중을 확인했습니다",
    ),
    "ck9_fail_mixed": (
        "prefix caching was switched together with other variables: {names}",
        "prefix caching을 다른 변수와 함께 바꿨습니다: {names}",
    ),
    "ck9_fail_nobase": (
        "prefix caching is on, but there is no baseline without it and no prefix-cache metrics",
        "prefix caching이 켜져 있지만 캐시 없는 기준선도, prefix cache 지표도 없습니다",
    ),
    "ck9_unknown_off": (
        "prefix caching is not enabled in this run ({how}); verify it in its own round later",
        "이 실행에서는 prefix caching이 켜져 있지 않습니다 ({how}). 나중에 별도 "
        "회차에서 검증하십시오",
    ),
    "ck9_engine_line": (
        "the engine reports enable_prefix_caching=True at log line {line}, without the flag",
        "플래그 없이도 엔진이 로그 {line}행에서 enable_prefix_caching=True를 보고합니다",
    ),
    "ck9_engine_off": (
        "the engine reports enable_prefix_caching=False at log line {line}",
        "엔진이 로그 {line}행에서 enable_prefix_caching=False를 보고합니다",
    ),
    "ck9_default_on": (
        "prefix caching is on by default ({how}); verify it in its own round: a baseline with "
        "--no-enable-prefix-caching, then the same run with it on",
        "prefix caching이 기본값으로 켜져 있습니다 ({how}). 별도 회차에서 검증하십시오: "
        "--no-enable-prefix-caching 기준선 다음에 켠 상태로 같은 실행",
    ),
    "ck9_pass_default_metrics": (
        "prefix caching is on by default ({how}); /metrics shows {hits} hits of {queries} "
        "queried tokens",
        "prefix caching이 기본값으로 켜져 있고 ({how}) /metrics에서 조회 토큰 {queries}개 중 "
        "{hits}개 적중을 확인했습니다",
    ),
    "ck9_unknown_no_engine": (
        "the log has no engine config line, so whether prefix caching was on is unknown "
        "(the flag alone does not decide it)",
        "로그에 엔진 설정 줄이 없어 prefix caching이 켜졌는지 알 수 없습니다 (플래그만으로는 "
        "정해지지 않습니다)",
    ),
    "sum_port_holder": (
        "Before launch, {holder}. No request was sent to that server; the command ran and "
        "reported its own failure.",
        "실행 전에 이미 {holder} (포트 점유). 그 서버에는 요청을 보내지 않았고, 명령은 실행되어 "
        "스스로 실패를 보고했습니다.",
    ),
    "ck9_probe_pass": (
        "the prefix probe sent the same long prompt twice: the second hit the cache "
        "({n} prefix checks recorded, none failed)",
        "prefix probe가 같은 긴 프롬프트를 두 번 보냈고 두 번째가 캐시에 적중했습니다 "
        "(prefix 점검 {n}개 기록, 실패 없음)",
    ),
    "ck9_probe_fail": (
        "the prefix probe's checks failed: {checks}",
        "prefix probe 점검이 실패했습니다: {checks}",
    ),
    "ck10_pass": (
        "this report has a 'Reproducibility limits' section",
        "이 문서에 '재현성의 한계' 절이 있습니다",
    ),
    "ck11_pass_nvml": (
        "GPU memory in use and processes of {n} GPU(s) recorded ({others} "
        "process(es) of other jobs)",
        "GPU {n}개의 메모리 사용량과 프로세스를 기록했습니다 (다른 작업 프로세스 {others}개)",
    ),
    "ck11_pass_notes": ("cluster state noted: {text}", "클러스터 상태 기록: {text}"),
    "ck11_fail": (
        "the GPU inventory failed ({error}) and notes.json has no cluster state",
        "GPU 조회가 실패했고 ({error}) notes.json에도 클러스터 상태가 없습니다",
    ),
    "ck11_unknown": (
        "no GPUs on this host and no cluster note",
        "이 호스트에는 GPU가 없고 클러스터 기록도 없습니다",
    ),
    # --- limits -------------------------------------------------------------------------
    "lim_intro": (
        "What this evidence can and cannot show:",
        "이 증거로 보일 수 있는 것과 없는 것:",
    ),
    "lim_1": (
        "Online serving is not fully deterministic: request scheduling, batching and execution "
        "order change from run to run, so one success does not prove the failure is gone, and "
        "the same output text is not guaranteed even with temperature 0.",
        "온라인 서버의 결과는 스케줄링과 실행 순서의 영향을 받으므로, 한 번 성공했다고 완전히 "
        "재현된 것으로 볼 수 없습니다. temperature 0이어도 같은 출력이 보장되지 않습니다.",
    ),
    "lim_2": (
        "vLLM's reproducibility guidance requires the same hardware and the same vLLM version; "
        "compare against runs with the same image id, driver and GPU model ({gpus}).",
        "vLLM 공식 재현성 문서는 같은 하드웨어와 같은 vLLM 버전이 필요하다고 설명합니다. 같은 "
        "이미지 식별자, 드라이버, GPU 모델({gpus})의 실행과 비교하십시오.",
    ),
    "lim_3": (
        "Start-up failures are what this bundle pins down: the first failing stage should repeat "
        "under the same conditions. Repeat the run and compare (`kk3evidence compare`) before "
        "calling it stable.",
        "이 번들이 고정하는 것은 시작 실패입니다. 같은 조건에서 같은 실패 단계가 반복되어야 "
        "합니다. 안정적이라고 말하기 전에 다시 실행해 비교하십시오 (`kk3evidence compare`).",
    ),
    "lim_4": (
        "On a shared cluster other jobs use GPU memory and network; the fingerprint is a "
        "snapshot taken at launch and cannot show what changed while the server ran.",
        "공유 클러스터에서는 다른 작업이 GPU 메모리와 네트워크를 사용합니다. 지문은 시작 시점의 "
        "스냅숏이며 실행 중의 변화는 보여 주지 못합니다.",
    ),
    "lim_5": (
        "Secrets were replaced by placeholders before anything was written ({n} redaction(s)); "
        "the same secret has the same placeholder, so bundles stay comparable.",
        "비밀값은 기록 전에 자리표시자로 바뀌었습니다 (가림 {n}건). 같은 비밀값은 같은 "
        "자리표시자를 쓰므로 번들끼리 비교할 수 있습니다.",
    ),
    "lim_nc": ("Not collected: {items}.", "수집하지 못한 항목: {items}."),
    "lim_cached": (
        "`cached_tokens` absent means unknown, not zero.",
        "`cached_tokens`가 없으면 0이 아니라 알 수 없음입니다.",
    ),
    # --- bundle -------------------------------------------------------------------------
    "b_id": ("Bundle id", "번들 ID"),
    "b_created": ("Created", "생성 시각"),
    "b_tool": ("Written by", "작성 도구"),
    "b_verify": (
        "Verify it with `kk3evidence validate {name}` before trusting any field.",
        "어떤 값이든 믿기 전에 `kk3evidence validate {name}`으로 검증하십시오.",
    ),
    "generated": ("Generated by kk3evidence {version}.", "kk3evidence {version}로 생성."),
    # --- github -------------------------------------------------------------------------
    "gh_env": ("Your current environment", "Your current environment"),
    "gh_env_summary": (
        "The output of <code>kk3evidence</code> fingerprint (collect_env-like)",
        "The output of <code>kk3evidence</code> fingerprint (collect_env-like)",
    ),
    "gh_bug": ("🐛 Describe the bug", "🐛 Describe the bug"),
    "gh_repro": ("Minimal start command:", "최소 시작 명령:"),
    "gh_logs": ("First failure and the log around it", "첫 실패와 그 주변 로그"),
    "gh_before": ("Before submitting a new issue...", "Before submitting a new issue..."),
    "gh_searched": (
        "Make sure you already searched for relevant issues, and asked the chatbot living at "
        "the bottom right corner of the [documentation page](https://docs.vllm.ai/en/latest/), "
        "which can answer lots of frequently asked questions.",
        "Make sure you already searched for relevant issues, and asked the chatbot living at "
        "the bottom right corner of the [documentation page](https://docs.vllm.ai/en/latest/), "
        "which can answer lots of frequently asked questions.",
    ),
    "gh_expected": (
        "Expected: the server reaches `api_ready` and answers the fixed request.",
        "기대 결과: 서버가 `api_ready`에 도달하고 고정 요청에 응답함.",
    ),
}


#: Korean names of the SPEC §2 stages; the contract string stays beside them in parentheses
_STAGE_KO: dict[str, str] = {
    "container_init": "컨테이너 시작",
    "device_discovery": "장치 인식",
    "weights_access": "가중치 접근",
    "engine_init": "엔진 초기화",
    "comm_group": "통신 그룹",
    "api_ready": "API 준비",
    "serving": "요청 처리",
}
_STATUS_KO: dict[str, str] = {"completed": "완료", "failed": "실패", "started": "시작됨"}
_CLASS_KO: dict[str, str] = {
    "needed": "필수", "feature": "기능", "load": "부하", "multi-node": "다중 노드",
    "observability": "관측", "business-wrapper": "업무용 래퍼", "unknown": "알 수 없음",
}


def stage_name(lang: Lang, stage: object) -> str:
    """``api_ready`` in English; ``API 준비 (api_ready)`` in Korean."""
    s = str(stage)
    return f"{_STAGE_KO[s]} ({s})" if lang == "ko" and s in _STAGE_KO else s


def status_name(lang: Lang, status: object) -> str:
    s = str(status)
    return _STATUS_KO.get(s, s) if lang == "ko" else s


def class_name(lang: Lang, cls: object) -> str:
    s = str(cls)
    return f"{_CLASS_KO[s]}, {s}" if lang == "ko" and s in _CLASS_KO else s


def text(lang: Lang, key: str, **fields: object) -> str:
    """The text ``key`` in ``lang`` with ``fields`` filled in."""
    en, ko = _CATALOG[key]
    template = ko if lang == "ko" else en
    return template.format(**fields) if fields else template.replace("{{", "{").replace("}}", "}")


def catalog_keys() -> list[str]:
    return sorted(_CATALOG)
