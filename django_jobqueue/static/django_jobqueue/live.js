/* Live pages of the job queue admin: an element with data-jq-live="<seconds>" is fetched
   again every that many seconds and replaced in place, without reloading the page. A button
   pauses and resumes it (the choice is kept for the browser tab). A page loaded from the
   server (no inline script) so that a strict Content-Security-Policy allows it. */
(function () {
    "use strict";
    var KEY = "jq-live-paused";

    function busy(region) {
        /* An operator at work in the region (a row ticked, a field focused): leave it be. */
        var active = document.activeElement;
        if (active && region.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
            return true;
        }
        if (region.querySelector("details.jq-confirm[open]") !== null) {
            return true;  /* a confirmation opened (cancel a running job): keep it open */
        }
        return region.querySelector("input[type=checkbox]:checked") !== null;
    }

    function rebind(region) {
        /* A refreshed list has new checkboxes, "select all" links and Run button: give them
           Django's selection behaviour again (admin/js/actions.js), as on a page load. */
        var boxes = region.querySelectorAll("tr input.action-select");
        if (window.Actions && boxes.length > 0) {
            window.Actions(boxes);
        }
    }

    function start(marker) {
        var every = Math.max(1, parseInt(marker.getAttribute("data-jq-live"), 10) || 5) * 1000;
        var target = marker.getAttribute("data-jq-live-target");
        var region = target ? document.getElementById(target) : marker;
        if (!region || !region.id) {
            return;
        }
        var paused = window.sessionStorage.getItem(KEY) === "1";
        var timer = null;
        var bar = document.createElement("p");
        bar.className = "jq-live";
        var status = document.createElement("span");
        var button = document.createElement("button");
        button.type = "button";
        button.className = "jq-live-toggle";
        bar.appendChild(button);
        bar.appendChild(document.createTextNode(" "));
        bar.appendChild(status);
        region.parentNode.insertBefore(bar, region);

        function show(text) {
            button.textContent = paused ? "Resume live updates" : "Pause live updates";
            status.textContent = text;
        }

        function refresh() {
            timer = null;
            if (paused) {
                return;
            }
            if (document.hidden) {  /* a tab in the background: look again later */
                schedule();
                return;
            }
            if (busy(region)) {
                show("Held while you select or type; every " + every / 1000 + " s otherwise.");
                schedule();
                return;
            }
            fetch(window.location.href, {credentials: "same-origin", headers: {"X-Jq-Live": "1"}})
                .then(function (response) {
                    if (!response.ok) {
                        throw new Error("HTTP " + response.status);
                    }
                    return response.text();
                })
                .then(function (html) {
                    var page = new DOMParser().parseFromString(html, "text/html");
                    var fresh = page.getElementById(region.id);
                    if (fresh) {
                        region.innerHTML = fresh.innerHTML;
                        rebind(region);
                    }
                    if (marker.id && !page.getElementById(marker.id)) {
                        paused = true;  /* the page is no longer live (the job finished) */
                        show("Updated " + new Date().toLocaleTimeString() + "; no longer live.");
                        return;
                    }
                    show("Updated " + new Date().toLocaleTimeString() + "; every " + every / 1000 + " s.");
                })
                .catch(function (error) {
                    show("Could not refresh (" + error.message + "); trying again.");
                })
                .then(schedule);
        }

        function schedule() {
            if (!paused && timer === null) {
                timer = window.setTimeout(refresh, every);
            }
        }

        button.addEventListener("click", function () {
            paused = !paused;
            window.sessionStorage.setItem(KEY, paused ? "1" : "0");
            if (timer !== null) {
                window.clearTimeout(timer);
                timer = null;
            }
            show(paused ? "Paused." : "Live: every " + every / 1000 + " s.");
            schedule();
        });
        show(paused ? "Paused." : "Live: every " + every / 1000 + " s.");
        schedule();
    }

    document.addEventListener("DOMContentLoaded", function () {
        var markers = document.querySelectorAll("[data-jq-live]");
        for (var i = 0; i < markers.length; i++) {
            start(markers[i]);
        }
    });
}());
