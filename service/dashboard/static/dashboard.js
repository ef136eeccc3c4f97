// Flex-DSA dashboard: submits the upload form and keeps progress live. Pages are complete without it.
"use strict";

(function () {
  const root = document.body.dataset.root || "";
  const ACTIVE = new Set(["queued", "running"]);

  function errorText(body, response) {
    // Every API error has one shape: {"error": {"code", "message", "details"}}.
    if (body && body.error) return body.error.message + " (" + body.error.code + ")";
    return "The server answered " + response.status + " " + response.statusText + ".";
  }

  function setProgress(container, percent, status) {
    const bar = container.querySelector("[data-field=progress]");
    if (!bar) return;
    const value = Math.max(0, Math.min(100, Number(percent) || 0));
    bar.querySelector(".bar").style.width = value + "%";
    bar.querySelector(".label").textContent = Math.round(value) + "%";
    bar.setAttribute("aria-valuenow", String(value));
    bar.classList.toggle("ended", status === "failed" || status === "cancelled");
  }

  function setStatus(container, status) {
    const badge = container.querySelector("[data-field=status]");
    if (badge) {
      badge.textContent = status;
      badge.className = "badge status-" + status;
    }
    container.dataset.status = status;
  }

  function setStage(container, stage) {
    const cell = container.querySelector("[data-field=stage]");
    if (cell) cell.textContent = stage || "–";
  }

  // --- upload form -------------------------------------------------------------------------------------
  const form = document.getElementById("upload-form");
  if (form) {
    const message = document.getElementById("upload-message");
    const say = (text, isError) => {
      message.textContent = text;
      message.classList.toggle("error", Boolean(isError));
    };
    // Synthetic calibration is offered when an int8-only target (it quantises every model) is chosen: as the
    // one target, among those compared, or through "all".
    const synthetic = document.getElementById("synthetic-calibration");
    const int8OnlyChosen = () => {
      const compared = Array.from(form.querySelectorAll("input[name=targets]:checked"));
      if (compared.length) return compared.some((box) => box.value === "all" || box.dataset.int8Only === "true");
      const option = form.elements.target.selectedOptions[0];
      return Boolean(option && option.dataset.int8Only === "true");
    };
    const showSynthetic = () => {
      if (synthetic) synthetic.hidden = !int8OnlyChosen();
    };
    form.addEventListener("change", showSynthetic);
    showSynthetic();
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const file = form.elements.model.files[0];
      if (!file) return say("Choose an .onnx file first.", true);
      if (file.size > Number(form.dataset.maxBytes)) return say("That file is larger than the upload limit.", true);
      const compared = Array.from(form.querySelectorAll("input[name=targets]:checked"), (box) => box.value);
      const spec = {
        target: form.elements.target.value,
        objective: form.elements.objective.value,
        validate_outputs: form.elements.validate_outputs.checked,
        measure_latency: form.elements.measure_latency.checked,
        disabled_rules: Array.from(form.querySelectorAll("input[name=disabled_rules]:checked"), (box) => box.value),
      };
      if (compared.length) {
        // Several targets: one job group, answered with its comparison page.
        delete spec.target;
        spec.targets = compared.includes("all") ? "all" : compared;
      }
      if (form.elements.cache_refresh && form.elements.cache_refresh.checked) spec.cache = "refresh";
      const allowSynthetic = form.elements.allow_synthetic_calibration;
      if (allowSynthetic && allowSynthetic.checked && int8OnlyChosen()) spec.allow_synthetic_calibration = true;
      const modelName = form.elements.model_name ? form.elements.model_name.value.trim() : "";
      if (modelName) spec.model_name = modelName;
      if (form.elements.precision && form.elements.precision.value !== "fp32") spec.precision = form.elements.precision.value;
      const buckets = form.elements.shape_buckets ? form.elements.shape_buckets.value.trim() : "";
      if (buckets) {
        try {
          spec.shape_buckets = JSON.parse(buckets);
        } catch (err) {
          return say('Shape buckets must be JSON, for example {"batch": [1], "seq": [32, 64]}.', true);
        }
      }
      const body = new FormData();
      body.append("model", file, file.name);
      body.append("spec", JSON.stringify(spec));
      const samples = form.elements.calibration ? form.elements.calibration.files[0] : null;
      if (samples) body.append("calibration", samples, samples.name);
      const button = form.querySelector("button[type=submit]");
      button.disabled = true;
      say("Uploading " + file.name + "…");
      try {
        const response = await fetch(root + "/optimize", { method: "POST", body, credentials: "same-origin" });
        const answer = await response.json().catch(() => null);
        if (!response.ok || !answer) throw new Error(errorText(answer, response));
        say(answer.cached ? "Answered from an identical earlier job." : "Queued.");
        if (answer.group_id) return window.location.assign(root + "/ui/groups/" + encodeURIComponent(answer.group_id));
        window.location.assign(root + "/ui/jobs/" + encodeURIComponent(answer.job_id));
      } catch (err) {
        say(err.message, true);
        button.disabled = false;
      }
    });
  }

  // --- job list: poll GET /jobs while any job shown is active --------------------------------------------
  const table = document.getElementById("job-table");
  if (table) {
    const rows = () => Array.from(table.querySelectorAll("tbody tr[data-job-id]"));
    const anyActive = () => rows().some((row) => ACTIVE.has(row.dataset.status));
    const firstPage = table.dataset.firstPage === "true";
    let timer = null;

    async function refresh() {
      const query = new URLSearchParams({ limit: table.dataset.limit });
      if (table.dataset.status) query.set("status", table.dataset.status);
      try {
        const response = await fetch(root + "/jobs?" + query, { credentials: "same-origin" });
        if (!response.ok) return schedule(5000);
        const page = await response.json();
        const byId = new Map(page.items.map((job) => [job.id, job]));
        let reload = firstPage && page.total !== Number(table.dataset.total); // jobs came or went
        for (const row of rows()) {
          const job = byId.get(row.dataset.jobId);
          if (!job) continue;
          const ended = ACTIVE.has(row.dataset.status) && !ACTIVE.has(job.status);
          setStatus(row, job.status);
          setStage(row, job.stage);
          setProgress(row, job.progress_percent, job.status);
          if (ended) reload = true; // the server renders the finished job's summary
        }
        if (reload) return window.location.reload();
      } catch (err) {
        return schedule(5000);
      }
      if (anyActive() || firstPage) schedule(anyActive() ? 1000 : 5000);
    }

    function schedule(ms) {
      clearTimeout(timer);
      timer = setTimeout(refresh, ms);
    }
    schedule(anyActive() ? 1000 : 5000);
  }

  // --- job page: SSE for events, GET /jobs/{id} for fine-grained progress ----------------------------------
  const jobCard = document.getElementById("job");
  if (jobCard && ACTIVE.has(jobCard.dataset.status)) {
    const events = document.getElementById("events");
    let finished = false;
    let timer = null;

    function finish() {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      if (source) source.close();
      window.location.reload(); // the report, artifacts and graph are rendered by the server
    }

    function apply(job) {
      setStatus(jobCard, job.status);
      setStage(jobCard, job.stage);
      setProgress(jobCard, job.progress_percent !== undefined ? job.progress_percent : job.progress * 100, job.status);
      if (!ACTIVE.has(job.status)) finish();
    }

    function addEventRow(event) {
      if (!events || events.querySelector('[data-event-id="' + event.id + '"]')) return;
      const row = document.createElement("tr");
      row.dataset.eventId = event.id;
      const at = new Date(event.at).toISOString().replace("T", " ").slice(0, 19) + " UTC";
      const cells = [at, event.kind, event.status, event.stage || "–", Math.round(event.progress * 100) + "%", event.message || ""];
      cells.forEach((text, index) => {
        const cell = document.createElement("td");
        cell.textContent = text;
        if (index === 0) cell.className = "small";
        if (index === 4) cell.className = "num";
        row.appendChild(cell);
      });
      events.appendChild(row);
    }

    let source = null;
    if (window.EventSource) {
      source = new EventSource(jobCard.dataset.eventsUrl, { withCredentials: true });
      const kinds = ["queued", "started", "progress", "retry", "cancel_requested", "cancelled", "succeeded", "failed", "cached"];
      for (const kind of kinds) {
        source.addEventListener(kind, (message) => {
          const event = JSON.parse(message.data);
          addEventRow(event);
          if (ACTIVE.has(event.status)) {
            setStatus(jobCard, event.status);
            setStage(jobCard, event.stage);
          }
        });
      }
      source.addEventListener("end", finish);
      // On a dropped stream the browser reconnects with Last-Event-ID; polling below covers the gap.
    }

    async function poll() {
      try {
        const response = await fetch(jobCard.dataset.statusUrl, { credentials: "same-origin" });
        if (response.ok) apply(await response.json());
      } catch (err) {
        /* the next poll tries again */
      }
      if (!finished) timer = setTimeout(poll, 1000);
    }
    timer = setTimeout(poll, 500);

    const cancel = document.getElementById("cancel-job");
    if (cancel) {
      cancel.hidden = false;
      cancel.addEventListener("click", async () => {
        if (!window.confirm("Cancel this job?")) return;
        cancel.disabled = true;
        const response = await fetch(jobCard.dataset.statusUrl, { method: "DELETE", credentials: "same-origin" });
        if (!response.ok) {
          const body = await response.json().catch(() => null);
          window.alert(errorText(body, response));
          cancel.disabled = false;
        }
      });
    }
  }
})();
