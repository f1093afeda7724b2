// The Export CSV button above each table (components.data_table) writes the table's rows, as
// filtered and sorted, to a CSV file. It asks the grid directly: no round trip to the server.
(function () {
  "use strict";

  document.addEventListener("click", function (e) {
    var button = e.target && e.target.closest ? e.target.closest("button.grid-export[data-grid]") : null;
    if (!button || !window.dash_ag_grid) {
      return;
    }
    var id = button.getAttribute("data-grid");
    var api = window.dash_ag_grid.getApi(id);
    if (api) {
      api.exportDataAsCsv({fileName: id + ".csv"});
    }
  });
})();
