// Click a column name of a report table to sort its rows by it (numbers as numbers); again to
// reverse. Inlined in every page by commprof.reporting.html; the page loads nothing else.
document.querySelectorAll('table.booktabs').forEach(function (table) {
  var names = table.tHead ? table.tHead.rows[table.tHead.rows.length - 1] : null;
  if (!names) { return; }
  Array.prototype.forEach.call(names.cells, function (th, column) {
    if (!th.classList.contains('sortable')) { return; }
    th.addEventListener('click', function () {
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      var up = th.getAttribute('aria-sort') !== 'ascending';
      Array.prototype.forEach.call(names.cells, function (c) { c.removeAttribute('aria-sort'); });
      th.setAttribute('aria-sort', up ? 'ascending' : 'descending');
      var key = function (row) {
        var text = row.cells[column] ? row.cells[column].textContent.trim() : '';
        var number = parseFloat(text.replace(/,/g, ''));
        return th.classList.contains('num') && !isNaN(number) ? number : text;
      };
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        var order = (typeof x === 'number' && typeof y === 'number') ? x - y
          : String(x).localeCompare(String(y), undefined, {numeric: true});
        return up ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
